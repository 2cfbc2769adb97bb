/* core/tok/added.h - added tokens (tokenizer.json `added_tokens`), found in
 * the text before pre-tokenization as HF's AddedVocabulary does
 * (tokenizers/src/tokenizer/added_vocabulary.rs):
 *   - two sets: tokens with normalized=false match the raw text, tokens
 *     with normalized=true match the normalized pieces (their content
 *     normalized by the same normalizer);
 *   - leftmost-longest, non-overlapping matches (aho-corasick
 *     MatchKind::LeftmostLongest), scanned left to right;
 *   - single_word: the match is dropped when a word char (Rust regex \w)
 *     touches it on either side;
 *   - lstrip / rstrip: the whitespace run before / after the match joins
 *     it (lstrip never reaching back into the previous match). */
#ifndef TANDEM_CORE_TOK_ADDED_H
#define TANDEM_CORE_TOK_ADDED_H

#include "core/tok/normalize.h"
#include "core/tok/tok_util.h"

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} AddedTok;

/* A byte trie over token contents. */
typedef struct {
    struct TrieNode { int32_t child, next, tok; uint8_t byte; } *node;   /* first-child / next-sibling */
    size_t n, cap;
    int32_t root_child[256];
    bool any;
    int first;                 /* the one byte every token starts with (-1: several) */
} AddedTrie;

typedef struct {
    AddedTok *tok;
    int n;
    StrMap by_content;        /* content -> index into tok */
    AddedTrie raw, norm;      /* normalized=false / normalized=true */
} Added;

/* Reads the `added_tokens` array j.  0, or -1 with err naming the entry. */
int added_load(Added *a, const cJSON *j, char *err, size_t n);
/* Builds both tries; normalized contents go through nz (NULL: none). */
int added_build(Added *a, const Normalizer *nz, NormScratch *ns, char *err, size_t n);
void added_free(Added *a);

/* Splits s[0..n) on the tokens of trie tr: appends to out, in order, the
 * pieces between matches (id -1) and the matches (id of the token), with
 * offsets relative to base (s = arena + base).  Empty pieces are not
 * appended.  `first`: s starts the original text (kept on the first
 * piece only). */
void added_split(const Added *a, const AddedTrie *tr, const char *s, size_t n, uint32_t base, bool first,
                 Pieces *out);

#endif
