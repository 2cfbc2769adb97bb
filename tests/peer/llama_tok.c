/* tests/peer/llama_tok.c - llama.cpp's tokenizer on the vocabulary of a
 * GGUF file, for tests/cli/gguf.sh: one {"ids": [...]} line per line of
 * TEXTS (without its \n), as `tandem tokenize --input TEXTS --jsonl`
 * prints them.  Built by the test against the llama.cpp peer's shared
 * libraries and headers (../shared/peers/llamacpp/setup.sh); not part of
 * tandem.
 *
 *   llama_tok MODEL.gguf TEXTS [--no-special]
 *
 * Special tokens named in the text are parsed (parse_special), as
 * Hugging Face's tokenizer(text) matches added tokens; --no-special: no
 * BOS/EOS added (add_special_tokens=False).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf TEXTS [--no-special]\n", argv[0]);
        return 2;
    }
    int add_special = !(argc > 3 && !strcmp(argv[3], "--no-special"));
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama_tok: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "llama_tok: cannot open %s\n", argv[2]);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        if (n > 0 && line[n - 1] == '\n') line[--n] = 0;
        int max = (int)n + 16;
        llama_token *ids = malloc(sizeof *ids * (size_t)max);
        int got = llama_tokenize(vocab, line, (int)n, ids, max, add_special, true);
        if (got < 0) {
            fprintf(stderr, "llama_tok: tokenize failed (%d)\n", got);
            rc = 1;
            free(ids);
            break;
        }
        printf("{\"ids\": [");
        for (int i = 0; i < got; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]}\n");
        free(ids);
    }
    free(line);
    fclose(f);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
