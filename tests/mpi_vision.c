/* tests/mpi_vision.c - the vision tower and projector under tensor
 * parallelism equal one process (docs/vision.md):
 *
 *   mpirun -np 2 build/tests/mpi_vision
 *
 * Every rank builds the same VLM twice from one seed (model_init_weights
 * draws the global tensors, so every topology gets the same model): once
 * alone (topo_single) and once as its shard of tp = np (heads, fc1 rows,
 * the projector's linear_1 rows split; o, fc2, linear_2 columns, summed
 * over tp).  The image vectors of 3 images and, from one upstream
 * gradient, every vision and projector gradient (this rank's slice) must
 * match the single process within float32 summation noise (tp sums
 * partial products in another order).  Exit 0 only when every rank passed.
 */
#include "comm/comm.h"
#include "core/common.h"
#include "core/model/vision.h"
#include "core/pool.h"
#include "tests/fixture.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void tp_sum(void *ctx, float *buf, size_t n)
{
    (void)ctx;
    comm_allreduce_f32(COMM_TP, buf, n);
}

/* max |a - b| / max |b| over this rank's slice of the global gradient. */
static double slice_err(const Param *p, const Param *g1)
{
    double num = 0, den = 0;
    const size_t rows = p->ndim == 2 ? p->lshape[0] : 1, cols = p->ndim == 2 ? p->lshape[1] : p->lshape[0];
    const size_t gcols = p->ndim == 2 ? p->shape[1] : p->shape[0];
    const size_t r0 = p->ndim == 2 ? p->loff[0] : 0, c0 = p->ndim == 2 ? p->loff[1] : p->loff[0];
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            const double a = p->g[r * cols + c], b = g1->g[(r0 + r) * gcols + c0 + c];
            num = fmax(num, fabs(a - b));
            den = fmax(den, fabs(b));
        }
    /* k_proj.bias: softmax does not see a bias shared by every key, its
     * gradient is 0 up to rounding (~1e-9): held absolutely */
    return den > 1e-6 ? num / den : num * 1e3;
}

int main(int argc, char **argv)
{
    if (comm_init(&argc, &argv)) return 1;
    pool_init(1);
    const int np = comm_size(), me = comm_rank();
    static const char *js = "{\"vocab_size\": 32, \"hidden_size\": 16, \"num_hidden_layers\": 1, "
                            "\"num_attention_heads\": 4, \"intermediate_size\": 32, \"first_k_dense_replace\": 1, "
                            "\"max_position_embeddings\": 64, \"image_token_index\": 31, \"vision_config\": "
                            "{\"hidden_size\": 24, \"intermediate_size\": 40, \"num_hidden_layers\": 2, "
                            "\"num_attention_heads\": 4, \"image_size\": 20, \"patch_size\": 4}}";
    ModelConfig cfg;
    char err[256];
    TD_CHECK(config_parse(&cfg, js, err, sizeof err) == 0, "%s", err);
    Topology t1, tt;
    topo_single(&t1, &cfg);
    TD_CHECK(topo_init(&tt, &cfg, 1, np, 1, 1, 1, me, NULL, err, sizeof err) == 0, "%s", err);
    TD_CHECK(comm_setup(&tt) == 0, "comm_setup");
    Model m1, mt;
    model_init(&m1, &cfg, &t1, true, 16);
    model_init(&mt, &cfg, &tt, true, 16);
    model_init_weights(&m1, 11);
    model_init_weights(&mt, 11);
    mt.comm.tp_allreduce = tp_sum;
    const size_t n_img = 3, S = m1.vis.S, R = n_img * m1.vis.P, d = m1.d;
    float *pixels = fixture_rand(n_img * 3 * S * S, 5, -1, 1), *dout = fixture_rand(R * d, 6, -1, 1);
    VisionActs a1, at;
    vision_acts_init(&a1, &m1, n_img);
    vision_acts_init(&at, &mt, n_img);
    vision_forward(&m1, &a1, pixels, n_img);
    vision_forward(&mt, &at, pixels, n_img);
    int bad = 0;
    double out_err = 0, out_max = 0;
    for (size_t i = 0; i < R * d; i++) {
        out_err = fmax(out_err, fabs((double)at.out[i] - a1.out[i]));
        out_max = fmax(out_max, fabs((double)a1.out[i]));
    }
    /* float32 partial sums in another order through 2 layers and the projector */
    if (!(out_err <= 2e-6 * out_max)) {
        fprintf(stderr, "FAIL rank %d: image vectors under tp=%d differ by %.3g (max %.3g)\n", me, np, out_err, out_max);
        bad = 1;
    }
    vision_backward(&m1, &a1, dout);
    vision_backward(&mt, &at, dout);
    int n_checked = 0;
    double worst = 0;
    for (int i = 0; i < mt.n_params; i++) {
        const Param *p = &mt.params[i];
        if (strncmp(p->name, "vision_tower/", 13) && strncmp(p->name, "multi_modal_projector/", 22)) continue;
        const Param *g1 = model_param(&m1, p->name);
        TD_CHECK(g1, "%s missing from the single-process model", p->name);
        const double e = slice_err(p, g1);
        worst = fmax(worst, e);
        n_checked++;
        if (!(e <= 1e-5)) {   /* measured <= 1e-6 */
            fprintf(stderr, "FAIL rank %d: gradient %s under tp=%d: rel diff %.3g\n", me, p->name, np, e);
            bad = 1;
        }
    }
    if (n_checked != 9 + 16 * 2) {
        fprintf(stderr, "FAIL rank %d: %d vision tensors checked\n", me, n_checked);
        bad = 1;
    }
    if (!bad)
        printf("ok   rank %d tp=%d: image vectors rel %.2g, %d gradients worst rel %.2g\n", me, np,
               out_err / out_max, n_checked, worst);
    double any = bad;
    comm_allreduce_f64(COMM_WORLD, &any, 1);
    vision_acts_free(&a1);
    vision_acts_free(&at);
    model_free(&m1);
    model_free(&mt);
    td_free(pixels);
    td_free(dout);
    pool_free();
    comm_finalize();
    return any > 0 ? 1 : 0;
}
