/* safetensors: read (mmap) and write Hugging Face safetensors checkpoints.
 *
 * File format: 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {...}, "name": {"dtype": "BF16", "shape": [a, b], "data_offsets": [begin,
 * end]}} then the data section; offsets are relative to the data section start (8 + N).
 *
 * Checksums (our addition, within the format: metadata values are strings): the writer puts
 * "dflash.checksums": "crc32c" and, for every tensor NAME, "crc32c.NAME": "xxxxxxxx" in
 * __metadata__: the CRC-32C (crc.h) of the tensor's data bytes as 8 lowercase hex digits. Other
 * readers (safetensors, transformers, SGLang, vLLM) ignore them. Ours parses them at open when
 * the marker is there (then one for every tensor; a key missing, extra or malformed is a
 * damaged header; without the marker "crc32c." keys are ignored) and checks the data on request
 * (safetensors_verify_tensor).
 *
 * Reader: safetensors_open() takes a .safetensors file, a model.safetensors.index.json (its
 * weight_map names the shard files, all opened and mmapped read-only) or a directory (index if
 * present, else model.safetensors). Every header is validated at open: length bounded by the file
 * size, JSON syntax, known dtype, shape product * dtype size == end - begin, offsets inside the
 * data section, tensors covering the data section contiguously with no overlap or gap, no
 * duplicate names (across shards too), index entries present in the shard they name. Errors name
 * the file, the tensor and what is wrong, and say which kind they are: a file that cannot be read
 * (DFLASH_EIO, DFLASH_ENOTFOUND) is not one whose bytes are wrong (DFLASH_EFORMAT). Tensors are
 * kept sorted by name; lookup is a binary search. The object is immutable after open: lookups
 * are thread-safe.
 *
 * Writer: declare tensors (name, dtype, shape, optionally data), then either commit (writes all
 * data pointers given) or begin + write chunks in declaration order (streaming, for checkpoints
 * larger than memory) + commit. The checksums are computed as the data is written (no second
 * read) and the header rewritten in place at commit. The file is written to PATH.tmp.<pid>,
 * fsync'd, renamed onto PATH and the directory fsync'd, so readers see the old file or the
 * complete new one.
 *
 * Callers: the target loader (weights), dflash-mkmodel, the drafter checkpoint writer, tests.
 */
#ifndef DFLASH_SAFETENSORS_H
#define DFLASH_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    SAFETENSORS_BF16 = 0,
    SAFETENSORS_F16,
    SAFETENSORS_F32,
    SAFETENSORS_I32,
    SAFETENSORS_I64,
    /* The format's other dtypes: opened and checked (a checkpoint may carry such tensors, e.g.
     * masks or FP8 scales, that we never read), never converted (safetensors_to_f32 refuses
     * them, naming the tensor) nor written. */
    SAFETENSORS_F64,
    SAFETENSORS_I8,
    SAFETENSORS_I16,
    SAFETENSORS_U8,
    SAFETENSORS_U16,
    SAFETENSORS_U32,
    SAFETENSORS_U64,
    SAFETENSORS_BOOL,
    SAFETENSORS_F8_E4M3,
    SAFETENSORS_F8_E5M2,
} safetensors_dtype;

#define SAFETENSORS_MAX_DIMS 8

typedef struct safetensors_tensor {
    const char *name; /* owned by the safetensors object */
    safetensors_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[SAFETENSORS_MAX_DIMS];
    int64_t numel;    /* product of shape (1 for a scalar) */
    const void *data; /* into the read-only mapping; may be unaligned for BF16/F16 */
    size_t bytes;     /* numel * dtype size */
    const char *file; /* path of the file holding it */
    bool has_crc32c;  /* its file carries checksums (see top) */
    uint32_t crc32c;  /* the stored checksum of the data bytes, when has_crc32c */
} safetensors_tensor;

typedef struct safetensors safetensors;
typedef struct safetensors_writer safetensors_writer;

/* Bytes per element (2, 2, 4, 4, 8 for the first five; the others' sizes). */
size_t safetensors_dtype_size(safetensors_dtype dt);
/* "BF16", "F16", "F32", "I32", "I64", "F64", ..., "F8_E5M2": the header's spelling. */
const char *safetensors_dtype_name(safetensors_dtype dt);
/* Parses the header spelling (also accepts lower case "bf16", "f16", "f32", "fp16", "fp32").
 * Returns 0 or DFLASH_EINVAL. */
int safetensors_dtype_parse(const char *s, safetensors_dtype *out);

/* Scalar conversions: bf16/f16 bits <-> float. The to-half ones round to nearest even. */
float safetensors_bf16_to_f32(uint16_t h);
uint16_t safetensors_f32_to_bf16(float f);
float safetensors_f16_to_f32(uint16_t h);
uint16_t safetensors_f32_to_f16(float f);

/* --- reader --- */

/* Opens and validates a file, an index json or a directory (see top). Returns the object or NULL
 * with the reason ("PATH: tensor NAME: ...") in err (may be NULL) and its kind in *rc (may be
 * NULL), so callers can tell a file they cannot read from one whose bytes are wrong:
 *   DFLASH_ENOTFOUND  the file (or a shard the index names) does not exist;
 *   DFLASH_EIO        it cannot be read: open, stat, read or mmap failed (permissions, an I/O
 *                     error, too many open files...; the system's reason in err), or the path is
 *                     a directory or a FIFO where a file should be;
 *   DFLASH_EFORMAT    its bytes are wrong: truncated, a bad header or index (a damaged file);
 *   DFLASH_EUNSUPPORTED a dtype the format does not define (tensors of every defined dtype
 *                     open; only a float one converts);  DFLASH_ENOMEM, DFLASH_EINVAL (no path).
 * *rc is 0 on success. */
safetensors *safetensors_open(const char *path, int *rc, char *err, size_t errlen);
/* Unmaps everything; accepts NULL and *st == NULL; sets *st = NULL. Tensor pointers die. */
void safetensors_close(safetensors **st);

/* Number of tensors over all shards, and the i-th in name order. */
size_t safetensors_count(const safetensors *st);
const safetensors_tensor *safetensors_at(const safetensors *st, size_t i);
/* The tensor called name, or NULL. */
const safetensors_tensor *safetensors_find(const safetensors *st, const char *name);
/* The path given to safetensors_open (for messages). */
const char *safetensors_path(const safetensors *st);
/* Value of key in a file's "__metadata__" (the first file that has it), or NULL. */
const char *safetensors_metadata(const safetensors *st, const char *key);

/* Recomputes t's checksum if it has one (reads its data): 0 (also when it has none), or
 * DFLASH_ECORRUPT with "FILE: tensor NAME: data checksum mismatch (...)" in err. */
int safetensors_verify_tensor(const safetensors_tensor *t, char *err, size_t errlen);

/* Finds name and checks its shape is [shape[0..ndim)]. Returns 0 with *out set, DFLASH_ENOTFOUND
 * ("PATH: tensor NAME not found") or DFLASH_EMISMATCH ("FILE: tensor NAME has shape [a,b],
 * expected [c,d]") with the message in err. out may be NULL. */
int safetensors_expect(const safetensors *st, const char *name, int ndim, const int64_t *shape,
                       const safetensors_tensor **out, char *err, size_t errlen);

/* Converts a float tensor (BF16, F16, F32) to fp32 into dst[0..t->numel). Returns 0, or
 * DFLASH_EUNSUPPORTED for integer dtypes. */
int safetensors_to_f32(const safetensors_tensor *t, float *dst);

/* safetensors_expect + safetensors_to_f32 into dst (numel floats). */
int safetensors_load_f32(const safetensors *st, const char *name, int ndim, const int64_t *shape,
                         float *dst, char *err, size_t errlen);

/* --- writer --- */

/* A writer for path (nothing is created until begin/commit). NULL on out of memory. */
safetensors_writer *safetensors_writer_new(const char *path);
/* Adds a "__metadata__" string entry (default: {"format": "pt"}). Before begin. 0 or negative
 * (DFLASH_EINVAL for a "crc32c." key or "dflash.checksums": the writer owns those). */
int safetensors_writer_meta(safetensors_writer *w, const char *key, const char *value);
/* Declares the next tensor. data (numel * dtype size bytes) is borrowed until commit, or NULL
 * when the bytes will be streamed with safetensors_writer_write. Refuses duplicate names,
 * ndim > SAFETENSORS_MAX_DIMS, negative dims (DFLASH_EINVAL). Before begin. */
int safetensors_writer_add(safetensors_writer *w, const char *name, safetensors_dtype dtype,
                           int ndim, const int64_t *shape, const void *data);
/* Creates the temporary file and writes the header. Optional: commit calls it. */
int safetensors_writer_begin(safetensors_writer *w);
/* Streams the next bytes of data, in declaration order, across tensor boundaries as needed.
 * DFLASH_ERANGE if more bytes than declared. After begin. */
int safetensors_writer_write(safetensors_writer *w, const void *data, size_t bytes);
/* Writes the data of remaining tensors that were given a pointer (DFLASH_ESTATE if one without
 * data remains unwritten), fsyncs, renames onto path, fsyncs the directory. 0 or negative;
 * on failure the temporary file is removed. */
int safetensors_writer_commit(safetensors_writer *w);
/* After DFLASH_EIO from begin, write or commit: the errno of the first failed system call
 * (ENOSPC for a full disk), for strerror; 0 when none failed. */
int safetensors_writer_errno(const safetensors_writer *w);
/* Frees the writer; removes the temporary file when not committed. Accepts NULL. */
void safetensors_writer_destroy(safetensors_writer **w);

/* Writes model.safetensors.index.json into dir: metadata.total_size and weight_map from the
 * names[i] -> files[i] pairs (files are base names). Atomic like the writer. 0, DFLASH_ENOMEM,
 * or DFLASH_EIO with errno the failing call's (fs_write_atomic). */
int safetensors_write_index(const char *dir, const char *const *names, const char *const *files,
                            size_t n, uint64_t total_size);

#endif
