/* main.c - the tandem command: sets up MPI (when launched by mpirun) and the
 * thread pool, then dispatches to the command layer of each module.  Only
 * the command layer exits; everything below returns status codes. */
#include "checkpoint/ckpt_cmd.h"
#include "checkpoint/ckpt_model.h"
#include "comm/comm.h"
#include "core/common.h"
#include "core/ops/gemm.h"
#include "core/pool.h"
#include "core/tok/tok_cmd.h"
#include "infer/infer_cmd.h"
#include "obs/plot_cmd.h"
#include "plan/plan_cmd.h"
#include "rl/rl.h"
#include "rl/rlcheck.h"
#include "train/quant/quant_cmd.h"
#include "train/train_cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*CmdFn)(int argc, char **argv);

/* score --rollout is the trainer's check of an RL rollout (rl/rlcheck.h);
 * plain score is train/'s.  Routed here so that train/ never includes rl/. */
static int cmd_score_any(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--rollout", 9) && (!argv[i][9] || argv[i][9] == '=')) return rlcheck_cmd(argc, argv);
    return cmd_score(argc, argv);
}

/* tokenize --tokenizer takes a checkpoint too: core/tok knows nothing of
 * checkpoint/, so the opener comes from here. */
static int cmd_tokenize_any(int argc, char **argv) { return cmd_tokenize(argc, argv, ckpt_open_tokenizer_arg); }
/* ckpt quantize calibrates on token files with the training forward
 * (train/quant/quant_cmd.c); the other ckpt subcommands are checkpoint/'s. */
static int cmd_ckpt_any(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "quantize")) return cmd_ckpt_quantize(argc - 1, argv + 1);
    return cmd_ckpt(argc, argv);
}

static const struct {
    const char *name;
    CmdFn fn;
    const char *help;
} g_cmds[] = {
    { "data", cmd_data, "prepare token files (data prepare ...) or the shapes images (data images ...)" },
    { "train", cmd_train, "train a model: train RUN.json [key=value ...]" },
    { "eval", cmd_eval, "validation loss and perplexity of a checkpoint" },
    { "score", cmd_score_any, "per-token log-probabilities of windows to HDF5" },
    { "generate", cmd_generate, "sample a completion from a checkpoint" },
    { "eval-vision", cmd_eval_vision, "a VLM's accuracy on image questions (tandem data images)" },
    { "serve", cmd_serve, "OpenAI-compatible HTTP server" },
    { "rollout", cmd_rollout, "RL rollout worker: samples, logprobs, routes, policy version" },
    { "ckpt", cmd_ckpt_any, "inspect, verify, reshard, export, diff, quantize checkpoints" },
    { "rl", cmd_rl, "GRPO post-training with exact rollout logprobs" },
    { "plot", cmd_plot, "PNG and SVG figures of runs' metrics: plot RUN_DIR [RUN_DIR ...] [--out DIR]" },
    { "plan", cmd_plan, "memory and communication plan of every parallel layout (no weights needed)" },
    { "tokenize", cmd_tokenize_any, "Hugging Face tokenizers: ids of a text, chat rendering, decode" },
    { NULL, NULL, NULL },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tandem <command> [options]    (tandem <command> --help for details)\n\ncommands:\n");
    for (int i = 0; g_cmds[i].name; i++) fprintf(f, "  %-10s %s\n", g_cmds[i].name, g_cmds[i].help);
}

/* Threads for this process: TANDEM_THREADS, else the cores shared evenly by
 * the ranks on this node. */
static int default_threads(void)
{
    const char *s = getenv("TANDEM_THREADS");
    if (s && atoi(s) > 0) return atoi(s);
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int ranks = local && atoi(local) > 0 ? atoi(local) : 1;
    int t = pool_cores() / ranks;
    return t > 0 ? t : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    int i = 0;
    while (g_cmds[i].name && strcmp(g_cmds[i].name, argv[1])) i++;
    if (!g_cmds[i].name) {
        td_error("unknown command '%s' (tandem --help lists them)", argv[1]);
        return 2;
    }
    if (comm_init(&argc, &argv)) return 1;
    pool_init(default_threads());
    int rc = g_cmds[i].fn(argc - 1, argv + 1);
    pool_free();
    gemm_scratch_free();   /* the caller's GEMM scratch; helpers free theirs */
    comm_finalize();
    return rc;
}
