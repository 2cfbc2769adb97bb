/* core/image/shapes.c - the shapes task (shapes.h) and `tandem data images`,
 * which writes DIR/img_NNNNNN.png and DIR/shapes.jsonl (docs/data.md). */
#include "core/image/shapes.h"
#include "core/args.h"
#include "core/common.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

const char *const shapes_shape_names[SHAPES_N_SHAPE] = { "circle", "square", "triangle" };
const char *const shapes_color_names[SHAPES_N_COLOR] = { "red", "green", "blue", "yellow", "magenta", "cyan", "white" };
const uint8_t shapes_color_rgb[SHAPES_N_COLOR][3] = {
    { 255, 0, 0 }, { 0, 255, 0 }, { 0, 0, 255 }, { 255, 255, 0 }, { 255, 0, 255 }, { 0, 255, 255 }, { 255, 255, 255 },
};

void shapes_sample(Rng *r, Shape *s)
{
    s->shape = (int)rng_below(r, SHAPES_N_SHAPE);
    s->color = (int)rng_below(r, SHAPES_N_COLOR);
    s->size = SHAPES_MIN + (int)rng_below(r, SHAPES_MAX - SHAPES_MIN + 1);
    s->x = (int)rng_below(r, (uint64_t)(SHAPES_SIZE - s->size + 1));
    s->y = (int)rng_below(r, (uint64_t)(SHAPES_SIZE - s->size + 1));
}

/* In doubled coordinates (pixel centre 2p + 1, box 2x .. 2x + 2 size) every
 * quantity is an integer, so the test is exact. */
bool shapes_covers(const Shape *s, int px, int py)
{
    long X = 2L * px + 1 - 2L * s->x, Y = 2L * py + 1 - 2L * s->y, S = 2L * s->size;
    if (X < 0 || Y < 0 || X > S || Y > S) return false;
    switch (s->shape) {
    case 0: { long dx = X - S / 2, dy = Y - S / 2; return dx * dx + dy * dy <= (S / 2) * (S / 2); }
    case 1: return true;
    default: { long dx = X - S / 2; return 2 * (dx < 0 ? -dx : dx) <= Y; }   /* half-width Y/2 at depth Y */
    }
}

void shapes_render(const Shape *s, Image *im)
{
    im->w = im->h = SHAPES_SIZE;
    im->rgb = td_calloc((size_t)SHAPES_SIZE * SHAPES_SIZE * 3);
    for (int y = 0; y < SHAPES_SIZE; y++)
        for (int x = 0; x < SHAPES_SIZE; x++)
            if (shapes_covers(s, x, y)) memcpy(im->rgb + ((size_t)y * SHAPES_SIZE + x) * 3, shapes_color_rgb[s->color], 3);
}

static const char *const QUESTIONS[3] = { "What color is the shape?", "What shape is this?", "Describe the image." };

static int data_images(const char *dir, long n, uint64_t seed)
{
    if (td_mkdir_p(dir)) {
        td_error("data images: %s: cannot create: %s", dir, strerror(errno));
        return 1;
    }
    char path[4096], tmp[4096], err[512];
    if (td_snprintf(path, sizeof path, "%s/shapes.jsonl", dir) || td_snprintf(tmp, sizeof tmp, "%s.tmp", path)) {
        td_error("data images: --output path too long");
        return 1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        td_error("data images: %s: cannot create: %s", tmp, strerror(errno));
        return 1;
    }
    Rng r;
    rng_seed(&r, seed);
    for (long i = 0; i < n; i++) {
        Shape s;
        shapes_sample(&r, &s);
        char name[32], png[4096];
        snprintf(name, sizeof name, "img_%06ld.png", i);
        Image im = { 0 };
        shapes_render(&s, &im);
        int rc = td_snprintf(png, sizeof png, "%s/%s", dir, name) ? -1 : image_write_png(png, &im, err, sizeof err);
        image_free(&im);
        if (rc) {
            td_error("data images: %s", err);
            fclose(f);
            return 1;
        }
        const char *color = shapes_color_names[s.color], *shape = shapes_shape_names[s.shape];
        char desc[64];
        snprintf(desc, sizeof desc, "a %s %s", color, shape);
        const char *answers[3] = { color, shape, desc };
        for (int q = 0; q < 3; q++)
            fprintf(f,
                    "{\"image\": \"%s\", \"prompt\": \"%s\", \"answer\": \"%s\", \"shape\": \"%s\", \"color\": \"%s\", "
                    "\"size\": %d, \"x\": %d, \"y\": %d}\n",
                    name, QUESTIONS[q], answers[q], shape, color, s.size, s.x, s.y);
    }
    int bad = fflush(f) || ferror(f);
    bad = fclose(f) || bad;
    if (bad || rename(tmp, path)) {
        td_error("data images: %s: write failed: %s", path, strerror(errno));
        return 1;
    }
    td_info("data images: %ld images and %ld prompts in %s", n, 3 * n, dir);
    return 0;
}

int image_data_cmd(int argc, char **argv)
{
    static const char *const spec[] = { "output=", "n=", "seed=", NULL };
    const char *usage = "usage: tandem data images --output DIR --n N [--seed S]";
    Args a = { 0 };
    char err[512] = "";
    if (args_parse(&a, argc, argv, 2, spec, err, sizeof err)) {
        td_error("data images: %s", err);
        return 2;
    }
    if (a.help) {
        printf("%s\n"
               "Writes the shapes task of SPEC section 13: N 64x64 PNGs DIR/img_NNNNNN.png\n"
               "(black background, one filled circle, square or triangle of one of 7 pure\n"
               "colours, 16-40 pixels across) and DIR/shapes.jsonl, three prompts per image\n"
               "with their answers.  The same seed (default 0) gives the same files.\n"
               "Format: docs/data.md\n", usage);
        args_free(&a);
        return 0;
    }
    const char *out = args_get(&a, "output");
    double n, seed;
    int rc = 2;
    if (!out || !args_get(&a, "n")) td_error("data images: --output and --n are required (%s)", usage);
    else if (a.n_pos) td_error("data images: unexpected argument '%s' (%s)", a.pos[0], usage);
    else if (args_num(&a, "n", 0, 1, 1e8, &n, err, sizeof err) < 0 || n != (double)(long)n ||
             args_num(&a, "seed", 0, 0, 9007199254740992.0, &seed, err, sizeof err) < 0 || seed != (double)(uint64_t)seed)
        td_error("data images: %s", err[0] ? err : "--n and --seed take whole numbers");
    else rc = data_images(out, (long)n, (uint64_t)seed);
    args_free(&a);
    return rc;
}
