/* checkpoint/hf/hf_map.h - a Hugging Face model directory mapped onto
 * tandem's parameters (SPEC section 9): the config (hf_config.h), the
 * safetensors (safetensors.h) and, for every tandem parameter, the HF
 * tensors it is made of and how (families.h).
 *
 * hf_model_open validates everything before any weight is read: the
 * architecture and config; the layout (v4 or v5: the one whose names the
 * files hold exactly); every tensor the config implies is present, with
 * the shape it implies and a float dtype (F32, F16, BF16, or F8_E4M3 with
 * its float32 block scale `<name>_scale_inv` of shape [ceil(rows / b0),
 * ceil(cols / b1)], b = quantization_config.weight_block_size, when
 * config.json has an fp8 quantization_config); every tensor of
 * the files is mapped or one of the family's skips.  A failure is one line
 * naming the tensor or key, and nothing is mapped; a model that opens is
 * mapped whole.
 *
 * Then a reader asks for boxes of tandem parameters, in tandem coordinates
 * (the slice a rank owns under its topology): a copied tensor is a box of
 * one HF tensor, a stacked one touches only its experts' tensors, a part
 * of a fused tensor a box of that tensor; only the bytes of the box are
 * read.  The headers are validated through the safetensors reader's map;
 * the bulk bytes are read with pread, in runs as long as the box allows
 * (no page-table work, nothing left resident in the process), by the pool
 * threads, converted to float32 on the way (F8: q * s in float32, s the
 * scale of the element's block, as DeepSeek's weight_dequant computes it).
 * Reads are thread-safe.
 */
#ifndef TANDEM_CHECKPOINT_HF_HF_MAP_H
#define TANDEM_CHECKPOINT_HF_HF_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/hf/families.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/safetensors.h"
#include "core/model/model.h"

typedef struct {
    char tandem[PARAM_NAME_MAX];     /* tandem parameter */
    const HfTensor *rule;
    int layer;                       /* -1 outside the layers */
    int ndim;
    size_t shape[PARAM_MAX_DIMS];    /* tandem global shape */
    const StTensor **src;            /* its HF tensors (one, or one per expert for a stack); borrowed */
    const StTensor **scale;          /* per src: its F8 block scale (<name>_scale_inv), or NULL */
    int n_src;
    StDtype dtype;                   /* theirs (F32 when they differ) */
} HfBinding;

typedef struct {
    HfConfig hc;                     /* config, family, config.json text */
    HfLayout layout;                 /* the layout the files have */
    StCheckpoint st;
    HfBinding *b;                    /* one per tandem parameter, in model order */
    int n_b;
    const StTensor **src;            /* storage of the bindings' src */
    const StTensor **scales;         /* storage of the bindings' scale */
    int *fd;                         /* per safetensors file: the bulk reads (pread) */
    char notes[1536];                /* config notes and skipped tensors, one line; "" when none */
} HfModel;

/* The rule of family fam mapping tandem parameter `tandem` in `layout`;
 * *layer gets its layer (-1 when it has none).  NULL when none. */
const HfTensor *hf_rule_for(const HfFamily *fam, HfLayout layout, const char *tandem, int *layer);

/* The HF tensors rule r makes of a tandem parameter of global shape
 * (ndim, shape) in layer `layer`: fn is called once per HF tensor with its
 * name, shape and expert (-1 unless a stack).  Returns the count, or -1
 * when a name does not fit. */
typedef int (*HfEachFn)(void *ctx, const char *hf_name, int ndim, const uint64_t *hf_shape, int expert);
int hf_expand(const HfTensor *r, int layer, int ndim, const size_t *shape, HfEachFn fn, void *ctx);

/* Opens and validates dir (see above).  Returns 0, or -1 with one line in
 * err ("DIR: ..."), h zeroed.  hf_model_close releases h (safe on a zeroed
 * struct and twice). */
int hf_model_open(HfModel *h, const char *dir, char *err, size_t err_len);
void hf_model_close(HfModel *h);

/* The binding of a tandem parameter, or NULL. */
const HfBinding *hf_model_find(const HfModel *h, const char *tandem);

/* Reads the box [off, off + cnt) of binding b, in tandem coordinates, into
 * out (row-major over the box): float32 (exact for F32/F16/BF16), or, raw,
 * the stored 16-bit values (b->dtype must be F16 or BF16).  Uses the
 * thread pool (pieces of the box on its threads); call from the main
 * thread.  Returns 0, or -1 with one line in err. */
int hf_read_box(const HfModel *h, const HfBinding *b, const size_t *off, const size_t *cnt, void *out, bool raw,
                char *err, size_t err_len);

/* The same on the calling thread alone, without the pool: for a thread
 * that reads while the main thread does something else. */
int hf_read_box_serial(const HfModel *h, const HfBinding *b, const size_t *off, const size_t *cnt, void *out,
                       bool raw, char *err, size_t err_len);

/* Hints the kernel to read ahead the bytes of b's box [off, off + cnt)
 * (posix_fadvise WILLNEED: asynchronous; a stack's experts outside the
 * box are not touched), returning about how many bytes that is. */
size_t hf_prefetch(const HfModel *h, const HfBinding *b, const size_t *off, const size_t *cnt);

/* Read-ahead on its own thread, so that the work of requesting the bytes
 * (page-cache pages allocated, disk requests queued: a tenth of a second
 * per 256 MB here) overlaps the reads instead of preceding them.  Boxes
 * 0 .. n-1 (their binding and box given by at(), called on that thread:
 * it must be thread-safe) are requested in order with hf_prefetch while
 * the bytes requested beyond the box being read stay under `ahead`; the
 * reader says which box it reads with hf_ahead_at (from one thread).
 * dst (or NULL), with dst_bytes: per box, the memory it will be read
 * into, faulted in by the thread with the box's bytes requested (fresh
 * memory's page faults then overlap the disk, not the conversion; never
 * written by the thread; both arrays borrowed until hf_ahead_stop).  The
 * thread sleeps while the window is full and only hints: reads are
 * correct whatever it has done.  hf_ahead_start returns NULL (and reads go
 * without read-ahead) when n or ahead is 0 or no thread starts;
 * hf_ahead_at and hf_ahead_stop accept NULL.  hf_ahead_stop joins and
 * frees it. */
typedef struct HfAhead HfAhead;
typedef const HfBinding *(*HfBoxFn)(void *ctx, int i, const size_t **off, const size_t **cnt);
HfAhead *hf_ahead_start(const HfModel *h, size_t ahead, int n, HfBoxFn at, void *ctx, void *const *dst,
                        const size_t *dst_bytes);
void hf_ahead_at(HfAhead *a, int i);
void hf_ahead_stop(HfAhead *a);

#endif
