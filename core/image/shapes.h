/* core/image/shapes.h - the shapes task of SPEC section 13 (docs/data.md,
 * "Images"): 64 x 64 RGB, black background, one filled circle, square or
 * triangle of one of seven pure colours, 16 to 40 pixels across, wholly
 * inside the image.  `tandem data images` writes them (image_data_cmd). */
#ifndef TANDEM_CORE_IMAGE_SHAPES_H
#define TANDEM_CORE_IMAGE_SHAPES_H

#include "core/image/image.h"
#include "core/rng.h"

#include <stdbool.h>

#define SHAPES_SIZE     64   /* image side, pixels */
#define SHAPES_MIN      16   /* shape extent, pixels (bounding box side) */
#define SHAPES_MAX      40
#define SHAPES_N_SHAPE  3
#define SHAPES_N_COLOR  7

extern const char *const shapes_shape_names[SHAPES_N_SHAPE];   /* circle square triangle */
extern const char *const shapes_color_names[SHAPES_N_COLOR];   /* red green blue yellow magenta cyan white */
extern const uint8_t shapes_color_rgb[SHAPES_N_COLOR][3];

/* One image's content: the shape fills part of the box [x, x + size) x
 * [y, y + size). */
typedef struct { int shape, color, size, x, y; } Shape;

/* Draws shape, colour, size and position (in that order) from r:
 * size uniform in [SHAPES_MIN, SHAPES_MAX], x and y uniform in
 * [0, SHAPES_SIZE - size]. */
void shapes_sample(Rng *r, Shape *s);
/* Whether pixel (px, py) is painted: its centre (px + 0.5, py + 0.5) lies
 *   circle:   within radius size/2 of the box's centre (a disc);
 *   square:   in the box;
 *   triangle: in the isosceles triangle with apex at the middle of the
 *             box's top edge and base its bottom edge (pointing up). */
bool shapes_covers(const Shape *s, int px, int py);
/* Renders s into im (allocated here, SHAPES_SIZE square; image_free). */
void shapes_render(const Shape *s, Image *im);

/* `tandem data images --output DIR --n N --seed S`. */
int image_data_cmd(int argc, char **argv);

#endif
