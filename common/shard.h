/* shard: the binary file of tokenised training data (docs/formats.md), mmapped read-only.
 *
 * Layout, little-endian:
 *   header (64 bytes): magic "DFSHARD\0", u32 version (2; 1 is read too), u32 header size (64),
 *     u64 n_seqs, u64 n_tokens, u64 index offset, u32 vocab size (0 = unknown), u32 longest
 *     sequence, 16 reserved bytes (0)
 *   records, one per sequence, back to back from byte 64: int32 ids[len], uint8 mask[len],
 *     zero padding to a multiple of 4 bytes
 *   index at the index offset (8-aligned), the last thing in the file: n_seqs entries of
 *     {u64 record offset, u32 len, u32 checksum}: the checksum is the CRC-32C of the record's
 *     5 * len bytes of ids and mask (version 2; version 1, still read, left it 0, unchecked)
 * Invariants checked at open: magic, version, file size == index offset + 16 * n_seqs, records
 * in order, contiguous, inside [64, index offset), len > 0, the sum of lengths == n_tokens,
 * the longest == the header's. Token ids against a vocabulary and the records against their
 * checksums: shard_verify_tokens (O(tokens); a bit flipped on disk after the writer, an id
 * still inside the vocabulary, would otherwise train silently);
 * the recorded vocabulary against a model's: shard_check_vocab (another tokenizer's data fits a
 * model's ids as often as not).
 *
 * A shard_set is several shards seen as one with global sequence ids (shard order, then index
 * order); it is what the batch plan numbers. Readers are immutable after open: thread-safe.
 * The writer streams records to PATH.tmp.<pid> and renames on commit (after fsync).
 * Callers: dflash-data (writer), the target (reader), tests.
 */
#ifndef DFLASH_SHARD_H
#define DFLASH_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC "DFSHARD"
#define SHARD_VERSION 2u /* written; 1 is read too */
#define SHARD_HEADER_BYTES 64u

typedef struct shard shard;
typedef struct shard_set shard_set;
typedef struct shard_writer shard_writer;

/* One sequence: pointers into the mapping, valid until the shard (set) is closed. */
typedef struct shard_seq {
    const int32_t *ids;
    const uint8_t *mask; /* 1 where the loss counts */
    uint32_t len;
} shard_seq;

/* Opens and validates path. NULL with "PATH: what is wrong" in err on failure. */
shard *shard_open(const char *path, char *err, size_t errlen);
/* Unmaps; accepts NULL; sets *s = NULL. */
void shard_close(shard **s);
uint64_t shard_count(const shard *s);
uint64_t shard_tokens(const shard *s);
uint32_t shard_vocab(const shard *s); /* as recorded by the writer; 0 = unknown */
uint32_t shard_max_len(const shard *s);
const char *shard_path(const shard *s);
/* Length of sequence i, 0 when i is out of range. */
uint32_t shard_len(const shard *s, uint64_t i);
/* Sequence i. 0 or DFLASH_ERANGE. */
int shard_get(const shard *s, uint64_t i, shard_seq *out);
/* Checks every id is in [0, vocab) and every mask byte is 0 or 1 (DFLASH_ERANGE with "PATH:
 * sequence N position P: token id X outside the vocabulary of V" in err), then each record
 * against its checksum (version 2: DFLASH_ECORRUPT with "PATH: sequence N ... checksum" in err).
 * 0 when all hold. */
int shard_verify_tokens(const shard *s, uint32_t vocab, char *err, size_t errlen);

/* Whether the vocabulary s records (when not 0) is that of a model with model_vocab tokens: the
 * two may differ by at most 1/128 of the larger, the padding models put past their tokenizer
 * (Qwen3: 151,669 tokens, vocab_size 151,936; Qwen2.5-7B's 152,064 rows against 0.5B's 151,936),
 * while another tokenizer is further apart (Llama-3's 128,256). 0, or DFLASH_EMISMATCH with
 * "PATH: made for a vocabulary of N ..., the model's is M ...; what to do" in err. */
int shard_check_vocab(const shard *s, uint32_t model_vocab, char *err, size_t errlen);

/* The shard's identity, a 64-bit digest of its header, its whole index (every sequence's
 * offset and length) and the first 64 tokens (ids and mask) of 1024 evenly spaced sequences
 * (all of them in a smaller shard): O(sequences), it does not read the whole file. Two shards
 * differ in identity unless they hold the same number of sequences of the same lengths at the
 * same offsets and agree on those sampled tokens. Part of the batch plan's identity
 * (batch_plan_identity), which the broker journals: the digest never changes between builds. */
uint64_t shard_identity(const shard *s);

/* A writer's temporary file is "<path>.tmp.<pid>" (removed on an error, at destroy and, in
 * dflash-data, on SIGINT/SIGTERM), held under an flock while it is written; one killed outright
 * leaves it: fs_remove_stale_temps(path, "a partial shard") before shard_writer_new. */

/* Writer for path; vocab (0 = unknown) is recorded and enforced by shard_writer_add. */
shard_writer *shard_writer_new(const char *path, uint32_t vocab);
/* Appends one sequence (len > 0, mask bytes 0/1, ids in [0, vocab) when vocab > 0).
 * DFLASH_EINVAL / DFLASH_ERANGE leave the writer usable; DFLASH_EIO does not. */
int shard_writer_add(shard_writer *w, const int32_t *ids, const uint8_t *mask, uint32_t len);
uint64_t shard_writer_count(const shard_writer *w);
/* After DFLASH_EIO: the errno of the first failed system call (ENOSPC for a full disk), for
 * strerror; 0 when nothing failed. */
int shard_writer_errno(const shard_writer *w);
/* Writes the index and header, fsyncs, renames onto path. 0 or negative (temp file removed). */
int shard_writer_commit(shard_writer *w);
/* Frees; removes the temporary file unless committed. Accepts NULL. */
void shard_writer_destroy(shard_writer **w);

/* Opens n shards as one (global ids in the given order). NULL with the reason in err. */
shard_set *shard_set_open(const char *const *paths, size_t n, char *err, size_t errlen);
/* Same from a comma-separated list of paths. */
shard_set *shard_set_open_list(const char *comma_list, char *err, size_t errlen);
/* Whether comma_list names no file (empty, or only commas and blanks): shard_set_open_list
 * would fail on it, which a program's option check says first (a bad configuration). */
bool shard_list_names_none(const char *comma_list);
void shard_set_close(shard_set **set);
uint64_t shard_set_count(const shard_set *set);
uint64_t shard_set_tokens(const shard_set *set);
/* Largest vocab recorded by any shard (0 if none recorded one). */
uint32_t shard_set_vocab(const shard_set *set);
uint32_t shard_set_len(const shard_set *set, uint64_t global_id);
/* Sequence global_id. 0 or DFLASH_ERANGE. */
int shard_set_get(const shard_set *set, uint64_t global_id, shard_seq *out);
/* Fills lens[0..shard_set_count) (input of batch_plan_new). */
void shard_set_lengths(const shard_set *set, uint32_t *lens);
/* The set's identity: the shards' identities (shard_identity) in order. */
uint64_t shard_set_identity(const shard_set *set);
/* shard_check_vocab over every shard. */
int shard_set_check_vocab(const shard_set *set, uint32_t model_vocab, char *err, size_t errlen);
/* shard_verify_tokens over every shard, in one pass; DFLASH_ENODATA when the whole set has
 * nothing to train on: "no trainable token" in err when no loss_mask byte is 1, "no anchor" when
 * no sequence has two loss tokens in a row (dflash_anchor_candidate, dflash_anchor.h), "no
 * anchor in a sequence the buckets keep" when only sequences longer than max_len have one.
 * max_len: the longest sequence the batch plan keeps (its last bucket bound; 0: any). */
int shard_set_verify_tokens(const shard_set *set, uint32_t vocab, uint32_t max_len, char *err,
                            size_t errlen);

#endif
