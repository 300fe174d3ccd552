/*
 * imgpipe.image._jpeg_shrink: a JPEG shrunk to a given size and re-encoded, in one call into libjpeg-turbo;
 * and a JPEG's entropy-coded data checked without decoding pixels.
 *
 * shrink(data, scale_num, width, height, quality) -> bytes
 * scan_problem(data) -> str | None
 * LIBJPEG_TURBO_VERSION: the version it was built against, e.g. "2.1.5"
 *
 * The source is decoded at scale_num/8 of its size in the DCT domain (libjpeg's scaled IDCT, itself
 * a low-pass filter), resized to width x height with Pillow's antialiased bilinear filter (a
 * triangle whose support grows with the reduction, with the same fixed-point coefficients as
 * Pillow's ImagingResample) and encoded as a baseline 4:2:0 JPEG at the given quality with
 * libjpeg's defaults, as Pillow's save() does. A 4:2:0 YCbCr source at full scale (most photos)
 * stays in planes: Y, Cb and Cr are decoded as stored, resized apart (the chroma on the luma's
 * scale) and encoded as planes, which skips libjpeg's chroma upsampling, both colour conversions
 * and the chroma downsampling, and resizes half as many samples. Any other source goes through
 * RGB. Pillow resizes rows first; here the columns go first and the rows are resized as columns
 * of the transposed image, so that both passes sum whole rows of contiguous bytes and vectorize.
 * So the pixels differ from Pillow's by a little (about 0.03 in mean |diff| on photos). Memory:
 * the decoded image and two smaller buffers, kept per thread between calls (fresh pages for every
 * image cost more than the resize itself). The same input and arguments always give the same bytes.
 *
 * Any libjpeg error or warning raises ValueError with libjpeg's message; the caller then hands
 * the image to Pillow. The caller checks the header's pixel count against its decompression-bomb
 * limit first. The GIL is released while working.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "imgpipe's JPEG shrinker needs libjpeg-turbo >= 1.5 (jpeg_mem_src, jpeg_mem_dest)"
#endif

#define CHANNELS 3
#define PRECISION_BITS (32 - 8 - 2) /* Pillow's fixed-point precision for 8-bit resampling */
#define BLOCK 8                     /* output rows resized together, then written transposed at once */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} ShrinkError;

/* One axis of the resize: for each output pixel, the first input pixel, the tap count and the weights. */
typedef struct {
    int *first, *taps, *weights;
    int ksize;
} Filter;

typedef struct {
    struct jpeg_decompress_struct dinfo;
    struct jpeg_compress_struct cinfo;
    ShrinkError err;
    int have_cinfo;
    /* In the thread's workspace: */
    uint8_t *pixels;  /* the decoded image: RGB rows, or the Y, Cb and Cr planes one after the other */
    uint8_t *turned;  /* one plane resized along the columns, transposed (resize_plane) */
    uint8_t *out;     /* the output: RGB rows, or the three planes padded to whole MCUs */
    int32_t *sums;    /* one output row of sums */
    uint8_t *clipped; /* BLOCK rows of the same as bytes */
    Filter horizontal, vertical, chroma_horizontal, chroma_vertical;
    unsigned char *jpeg;    /* the encoded result, from jpeg_mem_dest */
    unsigned long jpeg_size;
    int quality;
} Shrink;

/* The working buffers of this thread, reused by the next call: grown when too small, never freed. */
static _Thread_local uint8_t *workspace;
static _Thread_local size_t workspace_size;

static uint8_t *reserve(size_t size) {
    if (size > workspace_size) {
        free(workspace);
        workspace = malloc(size);
        workspace_size = workspace == NULL ? 0 : size;
    }
    return workspace;
}

static void escape(j_common_ptr info) {
    ShrinkError *err = (ShrinkError *)info->err;
    (*info->err->format_message)(info, err->message);
    longjmp(err->escape, 1);
}

/* Warnings (level -1) escape too; trace messages (level >= 0) are dropped. */
static void on_message(j_common_ptr info, int level) {
    if (level < 0) {
        escape(info);
    }
}

static double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for the bilinear filter: output pixel xx is centred
 * on input position (xx + 0.5) * scale (in_size / out_size, except for subsampled chroma, which follows
 * the luma's scale); 0, or -1 when out of memory. */
static int make_filter(Filter *f, int in_size, int out_size, double scale) {
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = filterscale; /* the triangle's support is 1 */
    f->ksize = (int)ceil(support) * 2 + 1;
    f->first = malloc(sizeof(int) * (size_t)out_size);
    f->taps = malloc(sizeof(int) * (size_t)out_size);
    f->weights = malloc(sizeof(int) * (size_t)out_size * (size_t)f->ksize);
    double *k = malloc(sizeof(double) * (size_t)f->ksize);
    if (f->first == NULL || f->taps == NULL || f->weights == NULL || k == NULL) {
        free(k);
        return -1;
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, total = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) {
            xmin = 0;
        }
        if (xmax > in_size) {
            xmax = in_size;
        }
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            k[x] = triangle((x + xmin - center + 0.5) / filterscale);
            total += k[x];
        }
        int *w = f->weights + (size_t)xx * f->ksize;
        for (int x = 0; x < f->ksize; x++) {
            double v = x < xmax && total != 0.0 ? k[x] / total : 0.0;
            w[x] = (int)(v < 0 ? -0.5 + v * (1 << PRECISION_BITS) : 0.5 + v * (1 << PRECISION_BITS));
        }
        f->first[xx] = xmin;
        f->taps[xx] = xmax;
    }
    free(k);
    return 0;
}

static void free_filter(Filter *f) {
    free(f->first);
    free(f->taps);
    free(f->weights);
}

static inline uint8_t clip8(int32_t v) {
    v >>= PRECISION_BITS;
    v = v < 0 ? 0 : v;
    v = v > 255 ? 255 : v;
    return (uint8_t)v;
}

/* The rows x columns pixels of `channels` bytes in `in` (rows in_stride bytes apart) resized along the
 * columns to out_rows, written transposed: row x of `out` (out_stride bytes apart) holds column x.
 * Each output row is a weighted sum of whole input rows, so the sums run over contiguous bytes and
 * vectorize. Writing the result transposed, BLOCK rows at a time, lets the same function then
 * resize the other axis, for less than a separate transpose costs (see resize_plane). */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default"))) /* AVX2's 32-bit multiply; SSE2 has none */
#endif
static void resize_columns(const Filter *f, const uint8_t *restrict in, int columns, size_t in_stride, int channels,
                           int out_rows, uint8_t *restrict out, size_t out_stride, int32_t *restrict sums,
                           uint8_t *restrict clipped) {
    size_t width = (size_t)columns * channels;
    for (int first = 0; first < out_rows; first += BLOCK) {
        int count = out_rows - first < BLOCK ? out_rows - first : BLOCK;
        for (int k = 0; k < count; k++) {
            int yy = first + k;
            const int *w = f->weights + (size_t)yy * f->ksize;
            for (size_t i = 0; i < width; i++) {
                sums[i] = 1 << (PRECISION_BITS - 1);
            }
            for (int y = 0; y < f->taps[yy]; y++) {
                const uint8_t *restrict row = in + (size_t)(f->first[yy] + y) * in_stride;
                int32_t weight = w[y];
                for (size_t i = 0; i < width; i++) {
                    sums[i] += row[i] * weight;
                }
            }
            uint8_t *restrict bytes = clipped + (size_t)k * width;
            for (size_t i = 0; i < width; i++) {
                bytes[i] = clip8(sums[i]);
            }
        }
        /* BLOCK output rows are BLOCK neighbouring pixels of each transposed row: one short copy each */
        uint8_t *restrict dst = out + (size_t)first * channels;
        if (channels == 1) {
            for (int x = 0; x < columns; x++, dst += out_stride) {
                for (int k = 0; k < count; k++) {
                    dst[k] = clipped[(size_t)k * width + x];
                }
            }
        } else {
            for (int x = 0; x < columns; x++, dst += out_stride) {
                for (int k = 0; k < count; k++) {
                    memcpy(dst + k * CHANNELS, clipped + (size_t)k * width + (size_t)x * CHANNELS, CHANNELS);
                }
            }
        }
    }
}

/* One plane (in_width x in_height pixels of `channels` bytes, rows in_stride apart) resized to
 * width x height into `out` (rows out_stride apart), through `turned` (in_width x height, transposed). */
static void resize_plane(Shrink *s, const Filter *vertical, const Filter *horizontal, const uint8_t *in, int in_width,
                         size_t in_stride, int channels, int width, int height, uint8_t *out, size_t out_stride) {
    size_t turned_stride = (size_t)height * channels;
    resize_columns(vertical, in, in_width, in_stride, channels, height, s->turned, turned_stride, s->sums, s->clipped);
    resize_columns(horizontal, s->turned, height, turned_stride, channels, width, out, out_stride, s->sums, s->clipped);
}

/* Copies the last column and row of a width x height plane into its padding up to padded_width x padded_height,
 * as libjpeg's own encoder pads the edge MCUs. */
/* The 16 luma and 8 + 8 chroma rows of the 4:2:0 MCU row starting at image row y, in planes at
 * base + offsets[i] with strides[i]: what jpeg_read_raw_data and jpeg_write_raw_data take. */
static void point_mcu_rows(JSAMPROW rows[3][16], uint8_t *base, const size_t offsets[3], const size_t strides[3], int y) {
    for (int r = 0; r < 16; r++) {
        rows[0][r] = base + offsets[0] + (size_t)(y + r) * strides[0];
    }
    for (int i = 1; i < 3; i++) {
        for (int r = 0; r < 8; r++) {
            rows[i][r] = base + offsets[i] + (size_t)(y / 2 + r) * strides[i];
        }
    }
}

static void pad_plane(uint8_t *plane, size_t stride, int width, int height, int padded_width, int padded_height) {
    for (int y = 0; y < height; y++) {
        uint8_t *row = plane + (size_t)y * stride;
        memset(row + width, row[width - 1], (size_t)(padded_width - width));
    }
    for (int y = height; y < padded_height; y++) {
        memcpy(plane + (size_t)y * stride, plane + (size_t)(height - 1) * stride, (size_t)padded_width);
    }
}

/* Carves the thread's workspace: sums and clipped rows for lines of up to `longest` bytes, then the three buffers. */
static int carve(Shrink *s, size_t longest, size_t pixels, size_t turned, size_t out) {
    uint8_t *space = reserve(sizeof(int32_t) * longest + BLOCK * longest + pixels + turned + out);
    if (space == NULL) {
        strcpy(s->err.message, "out of memory");
        return -1;
    }
    s->sums = (int32_t *)space; /* first: malloc's alignment suits int32 */
    s->clipped = space + sizeof(int32_t) * longest;
    s->pixels = s->clipped + BLOCK * longest;
    s->turned = s->pixels + pixels;
    s->out = s->turned + turned;
    return 0;
}

static size_t larger(size_t a, size_t b) {
    return a > b ? a : b;
}

static int round_up(int n, int multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

/* Whether shrink_planes applies: a 4:2:0 YCbCr JPEG decoded at full scale. */
static int can_stay_planar(const struct jpeg_decompress_struct *d, int scale_num) {
    const jpeg_component_info *c = d->comp_info;
    return scale_num == 8 && d->jpeg_color_space == JCS_YCbCr && d->num_components == 3 && c[0].h_samp_factor == 2 &&
           c[0].v_samp_factor == 2 && c[1].h_samp_factor == 1 && c[1].v_samp_factor == 1 && c[2].h_samp_factor == 1 &&
           c[2].v_samp_factor == 1;
}

/* The encoder of a width x height image of 3 components in ``space``, writing to s->jpeg: libjpeg's
   defaults (YCbCr 4:2:0, Huffman tables not optimized, baseline) at s->quality. */
static struct jpeg_compress_struct *begin_encoder(Shrink *s, int width, int height, J_COLOR_SPACE space) {
    struct jpeg_compress_struct *c = &s->cinfo;
    jpeg_create_compress(c);
    s->have_cinfo = 1;
    jpeg_mem_dest(c, &s->jpeg, &s->jpeg_size);
    c->image_width = (JDIMENSION)width;
    c->image_height = (JDIMENSION)height;
    c->input_components = CHANNELS;
    c->in_color_space = space;
    jpeg_set_defaults(c);
    jpeg_set_quality(c, s->quality, TRUE);
    return c;
}

/* The planes as they are stored (no chroma upsampling, no colour conversion), each resized (the chroma on
 * the luma's scale, so the planes stay aligned), padded to whole MCUs and encoded as planes again: half
 * the samples of the RGB path, and libjpeg's upsampling and downsampling skipped. */
static int shrink_planes(Shrink *s, int width, int height) {
    struct jpeg_decompress_struct *d = &s->dinfo;
    d->raw_data_out = TRUE;
    jpeg_start_decompress(d);
    int in_width = (int)d->output_width, in_height = (int)d->output_height;
    int mcu_rows = round_up(in_height, 16);
    size_t in_strides[3], in_offsets[3], pixels = 0;
    for (int i = 0; i < 3; i++) {
        in_strides[i] = (size_t)d->comp_info[i].width_in_blocks * DCTSIZE;
        in_offsets[i] = pixels;
        pixels += in_strides[i] * (size_t)(i == 0 ? mcu_rows : mcu_rows / 2);
    }
    int chroma_in_width = (int)d->comp_info[1].downsampled_width, chroma_in_height = (int)d->comp_info[1].downsampled_height;
    int chroma_width = (width + 1) / 2, chroma_height = (height + 1) / 2;
    size_t out_strides[3] = {(size_t)round_up(width, 16), (size_t)round_up(chroma_width, 8), (size_t)round_up(chroma_width, 8)};
    int out_rows[3] = {round_up(height, 16), round_up(height, 16) / 2, round_up(height, 16) / 2};
    size_t out_offsets[3] = {0, out_strides[0] * (size_t)out_rows[0], out_strides[0] * (size_t)out_rows[0] + out_strides[1] * (size_t)out_rows[1]};
    size_t out = out_offsets[2] + out_strides[2] * (size_t)out_rows[2];
    size_t longest = larger((size_t)in_width, (size_t)height);
    double x_scale = (double)in_width / width, y_scale = (double)in_height / height;
    if (carve(s, longest, pixels, (size_t)in_width * (size_t)height, out) < 0 ||
        make_filter(&s->horizontal, in_width, width, x_scale) < 0 || make_filter(&s->vertical, in_height, height, y_scale) < 0 ||
        make_filter(&s->chroma_horizontal, chroma_in_width, chroma_width, x_scale) < 0 ||
        make_filter(&s->chroma_vertical, chroma_in_height, chroma_height, y_scale) < 0) {
        strcpy(s->err.message, "out of memory");
        return -1;
    }
    JSAMPROW rows[3][16];
    JSAMPARRAY planes[3] = {rows[0], rows[1], rows[2]};
    while (d->output_scanline < d->output_height) {
        point_mcu_rows(rows, s->pixels, in_offsets, in_strides, (int)d->output_scanline);
        if (jpeg_read_raw_data(d, planes, 16) != 16) {
            strcpy(s->err.message, "ran out of rows");
            return -1;
        }
    }
    jpeg_finish_decompress(d);
    resize_plane(s, &s->vertical, &s->horizontal, s->pixels + in_offsets[0], in_width, in_strides[0], 1, width, height,
                 s->out, out_strides[0]);
    pad_plane(s->out, out_strides[0], width, height, (int)out_strides[0], out_rows[0]);
    for (int i = 1; i < 3; i++) {
        resize_plane(s, &s->chroma_vertical, &s->chroma_horizontal, s->pixels + in_offsets[i], chroma_in_width,
                     in_strides[i], 1, chroma_width, chroma_height, s->out + out_offsets[i], out_strides[i]);
        pad_plane(s->out + out_offsets[i], out_strides[i], chroma_width, chroma_height, (int)out_strides[i], out_rows[i]);
    }

    struct jpeg_compress_struct *c = begin_encoder(s, width, height, JCS_YCbCr);
    c->raw_data_in = TRUE;
    jpeg_start_compress(c, TRUE);
    while (c->next_scanline < c->image_height) {
        point_mcu_rows(rows, s->out, out_offsets, out_strides, (int)c->next_scanline);
        jpeg_write_raw_data(c, planes, 16);
    }
    jpeg_finish_compress(c);
    return 0;
}

/* Any other JPEG: decoded to RGB at scale_num/8, both axes resized, encoded from RGB by libjpeg. */
static int shrink_rgb(Shrink *s, int width, int height) {
    struct jpeg_decompress_struct *d = &s->dinfo;
    d->out_color_space = JCS_RGB;
    jpeg_start_decompress(d);
    int in_width = (int)d->output_width, in_height = (int)d->output_height;
    size_t in_stride = (size_t)in_width * CHANNELS, stride = (size_t)width * CHANNELS;
    if (carve(s, larger(in_stride, (size_t)height * CHANNELS), in_stride * (size_t)in_height, in_stride * (size_t)height,
              stride * (size_t)height) < 0 ||
        make_filter(&s->horizontal, in_width, width, (double)in_width / width) < 0 ||
        make_filter(&s->vertical, in_height, height, (double)in_height / height) < 0) {
        strcpy(s->err.message, "out of memory");
        return -1;
    }
    while (d->output_scanline < d->output_height) {
        JSAMPROW rows[1] = {s->pixels + (size_t)d->output_scanline * in_stride};
        if (jpeg_read_scanlines(d, rows, 1) != 1) {
            strcpy(s->err.message, "ran out of rows");
            return -1;
        }
    }
    jpeg_finish_decompress(d);
    resize_plane(s, &s->vertical, &s->horizontal, s->pixels, in_width, in_stride, CHANNELS, width, height, s->out, stride);

    struct jpeg_compress_struct *c = begin_encoder(s, width, height, JCS_RGB);
    jpeg_start_compress(c, TRUE);
    while (c->next_scanline < c->image_height) {
        JSAMPROW rows[1] = {s->out + (size_t)c->next_scanline * stride};
        jpeg_write_scanlines(c, rows, 1);
    }
    jpeg_finish_compress(c);
    return 0;
}

/* Decode, resize and encode; 0, or -1 with err.message set. No Python calls: runs without the GIL. */
static int run(Shrink *s, const unsigned char *data, size_t size, int scale_num, int width, int height, int quality) {
    if (setjmp(s->err.escape)) {
        return -1;
    }
    jpeg_mem_src(&s->dinfo, data, (unsigned long)size);
    jpeg_read_header(&s->dinfo, TRUE);
    s->dinfo.scale_num = (unsigned int)scale_num;
    s->dinfo.scale_denom = 8;
    s->quality = quality;
    return can_stay_planar(&s->dinfo, scale_num) ? shrink_planes(s, width, height) : shrink_rgb(s, width, height);
}

static PyObject *shrink(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer data;
    int scale_num, width, height, quality;
    if (!PyArg_ParseTuple(args, "y*iiii:shrink", &data, &scale_num, &width, &height, &quality)) {
        return NULL;
    }
    if (scale_num < 1 || scale_num > 8 || width < 1 || height < 1 || quality < 1 || quality > 100) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "need 1 <= scale_num <= 8, a positive size and 1 <= quality <= 100; got %d, %dx%d, %d",
                            scale_num, width, height, quality);
    }
    Shrink *s = calloc(1, sizeof(Shrink));
    if (s == NULL) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    s->dinfo.err = jpeg_std_error(&s->err.pub);
    s->cinfo.err = &s->err.pub;
    s->err.pub.error_exit = escape;
    s->err.pub.emit_message = on_message;
    jpeg_create_decompress(&s->dinfo);

    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = run(s, data.buf, (size_t)data.len, scale_num, width, height, quality);
    Py_END_ALLOW_THREADS;
    PyObject *out = status == 0 ? PyBytes_FromStringAndSize((const char *)s->jpeg, (Py_ssize_t)s->jpeg_size)
                                : PyErr_Format(PyExc_ValueError, "%s", s->err.message);
    jpeg_destroy_decompress(&s->dinfo);
    if (s->have_cinfo) {
        jpeg_destroy_compress(&s->cinfo);
    }
    free(s->jpeg);
    free_filter(&s->horizontal);
    free_filter(&s->vertical);
    free_filter(&s->chroma_horizontal);
    free_filter(&s->chroma_vertical);
    free(s);
    PyBuffer_Release(&data);
    return out;
}

/* scan_problem: what a full decode (Pillow's) does with the input, without making pixels. Pillow
 * ignores libjpeg's warnings (libjpeg papers over corrupt entropy-coded data with grey) and fails
 * on its errors, and on data that ends early ("image file is truncated"); so does this check.
 *
 * libjpeg reads the headers and sets up a whole decode (jpeg_start_decompress: the same checks of
 * tables, sampling factors and colour spaces). What is left would be decoding the entropy-coded
 * data, and in a sequential Huffman scan that cannot fail: libjpeg's Huffman decoder only warns
 * (bad codes, data cut short by a marker), and it stops at the first marker; the marker reader
 * then ignores a restart marker (or resynchronizes on it, at worst to the next marker, with a
 * warning) and stops at EOI. So when the scan holds no marker but RST0-RST7 before its EOI, the
 * decode would succeed and the Huffman data is not decoded here. Any other JPEG (progressive,
 * arithmetic-coded, or another marker before the EOI: the rest of a broken scan, which libjpeg
 * parses as a segment) is read whole: jpeg_consume_input in buffered-image mode decodes every
 * scan's entropy-coded data into the coefficient buffer, with no inverse DCT, upsampling or colour
 * conversion, and reads every marker as a full decode does. */
typedef struct {
    ShrinkError err;
    int ran_out;       /* jpeg_mem_src ran out of data (it then warns and inserts an EOI) */
    int reading_scans; /* past the headers and jpeg_start_decompress */
} CheckError;

static void on_check_message(j_common_ptr info, int level) {
    if (level < 0 && info->err->msg_code == JWRN_JPEG_EOF) {
        ((CheckError *)info->err)->ran_out = 1;
        escape(info);
    }
}

/* Whether Pillow's decoder has every row when the data ends here: a one-scan JPEG whose scan is read.
 * It then stops reading without an error (the rest would only be markers up to the EOI); any other
 * JPEG it reports as truncated. */
static int rows_complete(const struct jpeg_decompress_struct *d, const CheckError *check) {
    return check->ran_out && check->reading_scans && !d->progressive_mode && d->comps_in_scan == d->num_components &&
           d->Se == DCTSIZE2 - 1 && d->input_iMCU_row >= d->total_iMCU_rows;
}

/* Whether the entropy-coded data in [p, end) holds no marker but RST0-RST7 before an EOI. As libjpeg
 * reads it, 0xFF 0x00 is a data byte, and any run of 0xFF is one (fill bytes before a marker). */
static int only_restarts_before_eoi(const JOCTET *p, const JOCTET *end) {
    while ((p = memchr(p, 0xFF, (size_t)(end - p))) != NULL) {
        do {
            p++;
        } while (p < end && *p == 0xFF);
        if (p == end) {
            return 0;
        }
        JOCTET marker = *p++;
        if (marker != 0x00 && (marker < 0xD0 || marker > 0xD7)) {
            return marker == 0xD9;
        }
    }
    return 0;
}

/* 0 when Pillow's decoder would decode it whole, else -1 with err->message set. No Python calls: runs without the GIL. */
static int check_scans(struct jpeg_decompress_struct *d, CheckError *check, const unsigned char *data, size_t size) {
    if (setjmp(check->err.escape)) {
        return rows_complete(d, check) ? 0 : -1;
    }
    jpeg_mem_src(d, data, (unsigned long)size);
    jpeg_read_header(d, TRUE);
    const JOCTET *scan = d->src->next_input_byte;
    int sequential = !d->progressive_mode && !d->arith_code && d->Ss == 0 && d->Se == DCTSIZE2 - 1;
    int decoded = sequential && only_restarts_before_eoi(scan, scan + d->src->bytes_in_buffer);
    d->buffered_image = !decoded; /* buffered: the input can be consumed without producing output */
    jpeg_start_decompress(d);
    if (decoded) {
        return 0;
    }
    check->reading_scans = 1;
    for (;;) {
        int status = jpeg_consume_input(d);
        if (status == JPEG_REACHED_EOI) {
            return 0;
        }
        if (status == JPEG_SUSPENDED) { /* jpeg_mem_src never suspends: it warns and inserts an EOI */
            strcpy(check->err.message, "ran out of data");
            return -1;
        }
    }
}

static PyObject *scan_problem(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    struct jpeg_decompress_struct d;
    CheckError check = {.ran_out = 0, .reading_scans = 0};
    d.err = jpeg_std_error(&check.err.pub);
    check.err.pub.error_exit = escape;
    check.err.pub.emit_message = on_check_message;
    jpeg_create_decompress(&d);
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = check_scans(&d, &check, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS;
    jpeg_destroy_decompress(&d);
    PyBuffer_Release(&data);
    if (status == 0) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(check.err.message);
}

static PyMethodDef methods[] = {
    {"shrink", shrink, METH_VARARGS,
     "shrink(data, scale_num, width, height, quality) -> bytes: the JPEG decoded at scale_num/8 (1..8), resized to "
     "width x height with an antialiased bilinear filter and encoded as a baseline 4:2:0 JPEG at quality (1..100)."},
    {"scan_problem", scan_problem, METH_O,
     "scan_problem(data) -> str | None: None when libjpeg would decode the JPEG whole, ignoring its warnings as Pillow "
     "does (checked without making pixels), else libjpeg's message. The caller checks the pixel count first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "imgpipe.image._jpeg_shrink",
    "A JPEG shrunk to a given size and re-encoded, in one pass of libjpeg-turbo; a JPEG's scans checked without decoding pixels.", -1, methods, NULL, NULL, NULL, NULL,
};

#define STRINGIFY(x) #x
#define TOSTRING(x) STRINGIFY(x)

PyMODINIT_FUNC PyInit__jpeg_shrink(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "LIBJPEG_TURBO_VERSION", TOSTRING(LIBJPEG_TURBO_VERSION)) < 0) {
        Py_CLEAR(m);
    }
    return m;
}
