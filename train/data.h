/* train/data.h - token files and the training data order (SPEC section 8).
 *
 * Token file (written by `tandem data prepare`, read with mmap):
 *   offset  size  field
 *        0     8  magic "TNDMTOK1"
 *        8     4  version (uint32, 1)
 *       12     4  token width in bytes (uint32: 1, 2 or 4; byte-level = 1)
 *       16     8  count: tokens in the file (uint64)
 *       24     8  n_val: the last n_val tokens are the validation split
 *       32     4  vocab size the tokens were made for (uint32)
 *       36     4  tok_json_len: bytes of the tokenizer's tokenizer.json (0: none)
 *       40     4  tok_config_len: bytes of its tokenizer_config.json (0: none)
 *       44    20  reserved, zero
 *       64     -  count tokens, little-endian unsigned, width bytes each
 *        -     -  tokenizer.json then tokenizer_config.json (those lengths)
 * The training stream is tokens [0, count - n_val), validation the rest.
 * The tokenizer's files make the data say how it was made: a run trains
 * with that tokenizer by default and stores it in its checkpoints (files
 * of an older tandem have zeros there and read as "no tokenizer").
 * Byte-level tokenisation maps each byte to its value (V = 256); with a
 * tokenizer, each input file is encoded as one text (HF's tokenizer(text),
 * special tokens as HF adds them unless add_special is false), V is the
 * tokenizer's and the width is 1, 2 or 4 bytes as V needs.  Prepare keeps
 * the last val_fraction of every input file's tokens for validation, so
 * both splits sample every file.
 *
 * Order (shuffle=false): micro-batch i (counted from 0 over the whole run),
 * row r of B, takes the window starting at s = ((i*B) + r) * T of the stream,
 * wrapping at its end; inputs are tokens [s, s+T), targets [s+1, s+T+1).
 * dp rank j takes rows [j B/dp, (j+1) B/dp).  shuffle=true draws each row's
 * start uniformly from the stream with a generator seeded by `seed`, the
 * same draws on every rank.  The cursor (micro-batches consumed) and the
 * generator state are the loader's resumable state.
 */
#ifndef TANDEM_TRAIN_DATA_H
#define TANDEM_TRAIN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "core/tok/tokenizer.h"

#define DATA_HEADER_BYTES 64

typedef struct {
    const uint8_t *map;      /* owned mapping of the whole file */
    size_t map_len;
    const uint8_t *tokens;   /* map + header */
    uint32_t width;
    uint32_t vocab;
    uint64_t count, n_val;
    const char *tok_json, *tok_config;   /* inside map, not NUL-terminated; NULL when absent */
    uint32_t tok_json_len, tok_config_len;
} TokenFile;

/* Maps and validates a token file; one error line (via err) on failure. */
int tokfile_open(TokenFile *f, const char *path, char *err, size_t err_len);
void tokfile_close(TokenFile *f);
static inline int32_t tokfile_get(const TokenFile *f, uint64_t i)
{
    const uint8_t *p = f->tokens + i * f->width;
    if (f->width == 1) return p[0];
    if (f->width == 2) return (int32_t)(p[0] | (uint32_t)p[1] << 8);
    return (int32_t)(p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* Writes a token file from the given inputs (files, or directories whose
 * regular files are taken in name order, skipping strfile indexes *.dat
 * and symlinks): byte-level when tok is NULL or the byte-level tokenizer,
 * else the ids of tok, with its two files (tok_json_text, tok_config_text)
 * after the tokens (see above).  Returns 0 or -1 after one error line. */
int data_prepare(const char *const *inputs, int n_inputs, const char *output, double val_fraction,
                 const Tokenizer *tok, bool add_special);
/* Bytes per token for a vocabulary of V ids: 1, 2 or 4. */
uint32_t data_token_width(int64_t V);

/* A stream: the training or validation part of a file. */
typedef struct {
    const TokenFile *f;
    uint64_t begin, len;   /* tokens [begin, begin + len) */
} TokenStream;

TokenStream tokfile_train(const TokenFile *f);
TokenStream tokfile_val(const TokenFile *f);

typedef struct {
    TokenStream s;
    size_t B, T;           /* global micro-batch rows, sequence length */
    size_t row0, rows;     /* this rank's rows */
    bool shuffle;
    int64_t cursor;        /* micro-batches consumed */
    Rng rng;
} Loader;

void loader_init(Loader *l, TokenStream s, size_t B, size_t T, size_t dp, size_t dp_rank,
                 bool shuffle, uint64_t seed);
/* Next micro-batch: ids, targets (rows * T), row-major.  Advances the
 * cursor (and the generator when shuffling). */
void loader_next(Loader *l, int32_t *ids, int32_t *targets);

#endif
