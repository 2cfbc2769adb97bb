/* core/model/backprop.h - training forward and backward of a micro-batch:
 * activations kept or recomputed (recompute = none | full | selective), the
 * loss (cross-entropy + router aux and z losses, SPEC section 2) and the
 * gradients of every parameter.
 *
 *   none:      every layer keeps all its activations;
 *   full:      only each layer's input is kept, the layer is re-run in
 *              backward;
 *   selective: attention outputs and FFN/expert intermediates are recomputed
 *              in backward, the rest (norms, q, KV blocks, routing) kept.
 * All three give bit-identical gradients: recomputation runs the same
 * deterministic kernels on the same inputs.
 */
#ifndef TANDEM_CORE_MODEL_BACKPROP_H
#define TANDEM_CORE_MODEL_BACKPROP_H

#include "core/model/layer.h"

typedef enum { RECOMPUTE_NONE, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE } Recompute;

/* Activations of a training micro-batch of B sequences of T tokens: N =
 * B T rows, or under context parallelism (m->topo.cp > 1, layer.h CpView)
 * this rank's B T / cp rows, two chunks of each sequence. */
typedef struct {
    size_t B, T, N;
    size_t n_seq;                /* attention's query sequences: B, or 2B chunks under cp */
    Recompute mode;
    Arena arena;                 /* owned */
    float **x;                   /* residual stream: x[i] input of local layer i, x[n_local] output;
                                  * (Nl, d): under sequence parallelism this rank's rows
                                  * (core/model/layer.h), else all N */
    LayerActs *la;               /* per local layer (pointers into the arena / scratch) */
    LayerActs scratch;           /* shared buffers for recomputation and backward */
    float *hn, *rstdf, *logits, *logp, *lse_v;   /* head (N, d) (N) (N, V) (N) (N) */
    float *dx, *dtmp;            /* backward: (N, d) residual gradient (its first Nl rows, this
                                  * rank's, under sequence parallelism), (N, d) temp */
    float *dxg;                  /* (N, d) sp: dx gathered over tp; else aliases dx */
    float *dvec;                 /* (d) sp: a replicated vector's gradient from this rank's rows */
    float *dq, *dk, *dv, *datt, *dh; /* backward scratch */
    float *dfa, *dfb, *dfc;      /* (N*k or N, max(F, Fd, S)) */
    float *dqr, *dkr;            /* (N, H*hd) (N, Hkv*hd) gradients of qr, kr (q/k norm or clamp on) */
    float *qkdot;                /* (2N) full q/k norm: per-row dots */
    float *dqkw;                 /* (2 hd) per-head q/k norm: this micro-batch's weight gradients */
    float *dsgv;                 /* (N) gradient of the shared gate */
    /* MLA: gradients of mq (N, H (nope + rope)), matt (N, H v), cq and cqn
     * (N, qr), kva (N, r + rope), ckv and ckvn (N, r) */
    float *dmq, *dmatt, *dcq, *dcqn, *dkva, *dckv, *dckvn;
    float *dxd, *deo;            /* (N*k, d), dispatch side */
    float *dxe, *deoe;           /* expert side (ep*N*k, d); alias dxd/deo without ep */
    float *dprobs, *dlogits_r, *dtopk_w;  /* (N, E) (N, E) (N, k) */
    float *dlogits;              /* (N, V) */
    float *dlogp;                /* (N) */
    int32_t *seq_blocks;         /* block tables of the B sequences */
    AttnSeq *seqs;
    int32_t *pos;                /* (N) positions 0..T-1 per sequence */
    const int32_t *ids;          /* borrowed: ids of the last forward */
    size_t n_tot_last;           /* its n_tot */
    /* sequence-wise balance loss of a sigmoid router (DeepSeek-V3), set by
     * the caller: seq_bal computes it in forward (LossParts.seq_bal_sum),
     * dseq_bal is the gradient of the objective with respect to each
     * sequence's and layer's value (0: off) */
    bool seq_bal;
    float dseq_bal;
    /* images of the micro-batch (docs/vision.md), set by the caller before
     * the forward: pixels (n_img, 3, S, S), their vectors take the
     * placeholder rows of ids in order; vis (borrowed) keeps the tower's
     * activations.  n_img 0: text only. */
    struct VisionActs *vis;
    const float *pixels;
    size_t n_img;
    /* context parallelism (cp > 1 only): the view layers get, its table
     * of kv_seqs, and backward's dK, dV of the whole sequences
     * laid out rank-major for the reduce-scatter (B T rows) */
    CpView cpv;
    AttnSeq *cp_seqs;
    size_t *cp_krow;             /* (2B) each local chunk's sequence's first row in gk, gv */
    float *cdk, *cdv;
    /* wall seconds of backward in the attention block, the router and the
     * whole FFN block (router included), and of the head (forward and
     * backward): added to, zeroed by the caller (training's metrics; the
     * forward's are in la[i].t_attn ...) */
    double bt_attn, bt_router, bt_ffn, t_head;
} TrainActs;

/* Sizes and carves the arena for micro-batches of B x T (this rank's part
 * under cp: T must divide into 2 m->topo.cp chunks; the caller checks). */
void model_train_acts_init(TrainActs *a, const Model *m, size_t B, size_t T, Recompute mode);
void model_train_acts_free(TrainActs *a);
/* Bytes model_train_acts_init(a, m, B, T, mode) allocates (its arena and
 * tables), measured by the same carve on a dry arena; m may be a shape
 * (model_init_shape). */
size_t model_train_acts_bytes(const Model *m, size_t B, size_t T, Recompute mode);

/* Loss pieces of one micro-batch.  Sums are local (this dp rank); the
 * trainer combines them. */
typedef struct {
    double ce_sum;      /* -sum_t logp_t over local rows */
    double aux;         /* mean over MoE layers of aux (global statistics) */
    double z;           /* mean over MoE layers of z */
    int n_moe;          /* MoE layers in this stage */
    double seq_bal_sum; /* sum over local sequences and MoE layers of the sequence-wise
                         * balance loss (TrainActs.seq_bal; 0 otherwise) */
    double *expert_share_min, *expert_share_max;  /* per local layer (tokens share of the busiest/idlest expert) */
} LossParts;

/* Forward of a micro-batch: ids, targets (N = B*T rows; sequence b is rows
 * [bT, bT+T); under cp this rank's N rows, layer.h's CpView order).  Pipeline stages: the first stage embeds ids, a later one
 * expects its input in a->x[0]; only the last stage computes the head and
 * the loss (ce_sum is 0 elsewhere); a->x[n_local] is the stage's output.  n_tot: tokens of the micro-batch over all dp ranks.  Fills
 * a->logp and returns the loss pieces (share arrays: caller-owned, n_local
 * entries, may be NULL). */
void model_train_forward(const Model *m, TrainActs *a, const int32_t *ids, const int32_t *targets,
                         size_t n_tot, LossParts *lp);

/* Local layer i of model_train_forward alone (the same call it makes):
 * a->x[i] -> a->x[i + 1], a->la[i] filled, for consumers that walk the
 * layers one at a time (GPTQ's calibration).  No cp, no images. */
void model_train_forward_layer(const Model *m, TrainActs *a, const int32_t *ids, size_t n_tot, int i);
/* Local layer i's second half again (model_layer_forward_ffn): from
 * a->la[i].x_mid into a->x[i + 1]. */
void model_train_forward_layer_ffn(const Model *m, TrainActs *a, const int32_t *ids, size_t n_tot, int i);
/* Backward of the same micro-batch; adds into m->g.  Pipeline stages: a
 * stage other than the last expects the gradient of its output in a->dx;
 * a stage other than the first leaves the gradient of its input there.  dlogp (N): gradient of
 * the objective with respect to each target log-probability (cross-entropy:
 * -scale / n_tot); daux, dz: gradient with respect to each layer's aux and z
 * (coef * scale / n_moe_layers). */
void model_train_backward(Model *m, TrainActs *a, const int32_t *targets, const float *dlogp,
                          float daux, float dz);

/* Backward of model_experts_forward for the rows of la (its xe, eg, eu,
 * eh, e_off, n_recv): adds into dxe (R, d) the input gradient and into
 * the experts' weight gradients, from deoe (R, d), the gradient of eoe.
 * deh, deg, deu: (R, F) scratch, overwritten. */
void model_experts_backward(Model *m, const Layer *L, const LayerActs *la, float *dxe, const float *deoe,
                            float *deh, float *deg, float *deu);

#endif
