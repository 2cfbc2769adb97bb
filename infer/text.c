/* infer/text.c - byte tokens to valid UTF-8 (text.h). */
#include "infer/text.h"

/* Length of the valid UTF-8 sequence starting at b[0] (1..4), 0 when
 * invalid, -1 when b holds a valid but incomplete prefix. */
static int seq_len(const uint8_t *b, size_t n)
{
    uint8_t c = b[0];
    int len;
    uint32_t min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; min = 0x10000; }
    else return 0;
    uint32_t cp = c & (0x3f >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        if ((b[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (b[i] & 0x3f);
        /* early rejection of overlong / surrogate / too-large forms */
        if (i == 1 && ((len == 3 && c == 0xe0 && b[1] < 0xa0) || (len == 3 && c == 0xed && b[1] > 0x9f) ||
                       (len == 4 && c == 0xf0 && b[1] < 0x90) || (len == 4 && c == 0xf4 && b[1] > 0x8f)))
            return 0;
    }
    return cp >= min ? len : 0;
}

int text_utf8_len(const int32_t *ids, size_t n)
{
    uint8_t buf[4];
    size_t m = n < 4 ? n : 4;
    for (size_t j = 0; j < m; j++) buf[j] = (uint8_t)ids[j];
    return seq_len(buf, m);
}

size_t text_from_tokens(char *out, const int32_t *ids, size_t n)
{
    size_t o = 0, i = 0;
    uint8_t buf[4];
    while (i < n) {
        size_t m = n - i < 4 ? n - i : 4;
        for (size_t j = 0; j < m; j++) buf[j] = (uint8_t)ids[i + j];
        int l = seq_len(buf, m);
        if (l > 0) {
            for (int j = 0; j < l; j++) out[o++] = (char)buf[j];
            i += (size_t)l;
        } else {   /* U+FFFD for one bad byte */
            out[o++] = (char)0xef;
            out[o++] = (char)0xbf;
            out[o++] = (char)0xbd;
            i++;
        }
    }
    out[o] = 0;
    return o;
}

size_t text_complete_prefix(const uint8_t *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int l = seq_len(b + i, n - i);
        if (l < 0) return i;
        i += l > 0 ? (size_t)l : 1;
    }
    return n;
}

size_t text_to_tokens(int32_t *ids, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) ids[i] = (int32_t)(unsigned char)s[i];
    return len;
}
