/* config_keys: every option name of every dflash program (the union of their cfg_tables), so
 * that a DFLASH_CONFIG file, which all of them read, can tell another program's key (skipped)
 * from one no program has (a misspelling: warned). The programs' tables live in their own
 * sources (offsets into their own structs), so the names are listed here once more, sorted;
 * test_config_keys runs every program's --help (the benches' that read config files too) and
 * fails, naming the name, when this list and the programs' options differ either way.
 */
#include "config_keys.h"

#include "config.h"

static const char *const every_key[] = {
    "accumulate", "admin-keys", "anchor-seed", "anchors", "backend", "batch", "batches-per-bucket",
    "bind", "block-size", "bos", "broker-wait-ms", "buckets", "build-dir", "capture-layers",
    "checkpoint", "checkpoint-dir", "checkpoint-every", "claims", "clip", "comm", "comm-timeout-s",
    "compact-bytes", "consumer-rate", "copy-ms", "count", "curve-clients", "curve-key",
    "curve-secret-key", "curve-server-key", "data", "device", "draft-layers", "drafter-device",
    "drafter-ms-base", "drafter-ms-per-1k", "drafters", "dtype", "endpoint", "eos", "epochs",
    "eval-seqs", "exit-when-drained", "family", "force", "fsync", "gamma", "greedy", "group",
    "group-hold-ms", "group-size", "group-wait-s", "head-dim", "heads", "heartbeat-ms", "hidden",
    "in", "init-only", "init-seed", "init-std", "init-weights", "insecure-tcp", "intermediate",
    "jitter", "journal", "journal-retry-ms", "json", "keep-last", "kv-heads", "layers",
    "lease-timeout-ms", "liveness", "llama3-rope-scaling", "log-level", "lr", "mask-token-id",
    "max-batches", "max-copy-failures", "max-depth", "max-epochs", "max-len", "max-new",
    "max-peers", "max-pos", "max-redeliveries", "max-seqs", "max-steps", "metrics-dir",
    "min-lr-ratio", "min-ready", "mix-window", "model", "n", "name", "norm-jitter",
    "orphan-grace-ms", "out", "preset", "producer-rate", "progress-ms", "prompt-max", "prompt-min",
    "prompts", "pub-endpoint", "rate", "resume", "rms-norm-eps", "rope-factor", "rope-high-freq",
    "rope-low-freq", "rope-original-max", "rope-theta", "runtime-dir", "seconds", "seed",
    "shard-size-mb", "shards", "shares", "show-errors", "slots", "stall-exit-s",
    "stats-interval-ms", "stop-at-eos", "stop-grace-ms", "strict", "target-ms-base",
    "target-ms-per-1k", "targets", "temperature", "threads", "tie", "timeout-ms", "token-budget",
    "total-steps", "train", "tune-matmuls", "verify", "verify-model", "verify-slots", "verify-tol",
    "vocab", "vocab-size", "warmup", "warmup-ratio", "weight-decay", "window"
};

bool config_key_of_any_program(const char *name)
{
    size_t lo = 0, hi = sizeof every_key / sizeof every_key[0];
    while (lo < hi) { /* every_key is sorted */
        size_t mid = (lo + hi) / 2;
        int c = config_name_cmp(name, every_key[mid]); /* as config_find compares */
        if (c == 0) return true;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return false;
}

size_t config_every_key(const char *const **keys)
{
    *keys = every_key;
    return sizeof every_key / sizeof every_key[0];
}
