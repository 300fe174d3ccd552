/*
 * imgpipe._jpeg_shrink: a JPEG shrunk to a given size and re-encoded, in one call into libjpeg-turbo.
 *
 * shrink(data, scale_num, width, height, quality) -> bytes
 * LIBJPEG_TURBO_VERSION: the version it was built against, e.g. "2.1.5"
 *
 * The source is decoded as RGB at scale_num/8 of its size in the DCT domain (libjpeg's scaled
 * IDCT, itself a low-pass filter), then resized to width x height with Pillow's antialiased
 * bilinear filter (a triangle whose support grows with the reduction, with the same fixed-point
 * coefficients as Pillow's ImagingResample), and encoded as a baseline 4:2:0 JPEG at the given
 * quality with libjpeg's defaults, as Pillow's save() does. Pillow resizes rows first; here the
 * columns go first and the rows are resized as columns of the transposed image, so that both
 * passes sum whole rows of contiguous bytes and vectorize (pixels may differ from Pillow's by
 * one). Memory: the scaled image and two smaller buffers, kept per thread between calls (fresh
 * pages for every image cost more than the resize itself). The same input and arguments always
 * give the same bytes.
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
    uint8_t *pixels; /* the decoded image, rows x columns x 3 */
    uint8_t *turned; /* resized along the columns, transposed: decoded width x output height x 3 */
    uint8_t *out;    /* output height x width x 3 */
    int32_t *sums;   /* one output row of sums */
    uint8_t *clipped; /* BLOCK rows of the same as bytes */
    Filter horizontal, vertical;
    unsigned char *jpeg;    /* the encoded result, from jpeg_mem_dest */
    unsigned long jpeg_size;
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

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for the bilinear filter; 0, or -1 when out of memory. */
static int make_filter(Filter *f, int in_size, int out_size) {
    double scale = (double)in_size / out_size;
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

/* The rows x columns RGB pixels of `in` resized along the columns to out_rows, written transposed:
 * `out` is columns x out_rows. Each output row is a weighted sum of whole input rows, so the sums
 * run over contiguous bytes and vectorize. Writing the result transposed, BLOCK rows at a time,
 * lets the same function then resize the other axis, for less than a separate transpose costs.
 * Two calls resize both axes and leave the image upright. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default"))) /* AVX2's 32-bit multiply; SSE2 has none */
#endif
static void resize_columns(const Filter *f, const uint8_t *restrict in, int columns, int out_rows, uint8_t *restrict out,
                           int32_t *restrict sums, uint8_t *restrict clipped) {
    size_t stride = (size_t)columns * CHANNELS;
    for (int first = 0; first < out_rows; first += BLOCK) {
        int count = out_rows - first < BLOCK ? out_rows - first : BLOCK;
        for (int k = 0; k < count; k++) {
            int yy = first + k;
            const int *w = f->weights + (size_t)yy * f->ksize;
            for (size_t i = 0; i < stride; i++) {
                sums[i] = 1 << (PRECISION_BITS - 1);
            }
            for (int y = 0; y < f->taps[yy]; y++) {
                const uint8_t *restrict row = in + (size_t)(f->first[yy] + y) * stride;
                int32_t weight = w[y];
                for (size_t i = 0; i < stride; i++) {
                    sums[i] += row[i] * weight;
                }
            }
            uint8_t *restrict bytes = clipped + (size_t)k * stride;
            for (size_t i = 0; i < stride; i++) {
                bytes[i] = clip8(sums[i]);
            }
        }
        /* BLOCK output rows are BLOCK neighbouring pixels of each transposed row: one short copy each */
        uint8_t *restrict dst = out + (size_t)first * CHANNELS;
        for (int x = 0; x < columns; x++, dst += (size_t)out_rows * CHANNELS) {
            for (int k = 0; k < count; k++) {
                memcpy(dst + k * CHANNELS, clipped + (size_t)k * stride + (size_t)x * CHANNELS, CHANNELS);
            }
        }
    }
}

/* Decode, resize and encode; 0, or -1 with err.message set. No Python calls: runs without the GIL. */
static int run(Shrink *s, const unsigned char *data, size_t size, int scale_num, int width, int height, int quality) {
    if (setjmp(s->err.escape)) {
        return -1;
    }
    jpeg_mem_src(&s->dinfo, data, (unsigned long)size);
    jpeg_read_header(&s->dinfo, TRUE);
    s->dinfo.out_color_space = JCS_RGB;
    s->dinfo.scale_num = (unsigned int)scale_num;
    s->dinfo.scale_denom = 8;
    jpeg_start_decompress(&s->dinfo);
    int in_width = (int)s->dinfo.output_width, in_height = (int)s->dinfo.output_height;
    size_t in_stride = (size_t)in_width * CHANNELS, stride = (size_t)width * CHANNELS;
    size_t longest = in_stride > (size_t)height * CHANNELS ? in_stride : (size_t)height * CHANNELS;
    size_t pixels = in_stride * (size_t)in_height, turned = in_stride * (size_t)height, out = stride * (size_t)height;
    uint8_t *space = reserve(sizeof(int32_t) * longest + BLOCK * longest + pixels + turned + out);
    if (space == NULL || make_filter(&s->horizontal, in_width, width) < 0 || make_filter(&s->vertical, in_height, height) < 0) {
        strcpy(s->err.message, "out of memory");
        return -1;
    }
    s->sums = (int32_t *)space; /* first: malloc's alignment suits int32 */
    s->clipped = space + sizeof(int32_t) * longest;
    s->pixels = s->clipped + BLOCK * longest;
    s->turned = s->pixels + pixels;
    s->out = s->turned + turned;
    while (s->dinfo.output_scanline < s->dinfo.output_height) {
        JSAMPROW rows[1] = {s->pixels + (size_t)s->dinfo.output_scanline * in_stride};
        if (jpeg_read_scanlines(&s->dinfo, rows, 1) != 1) {
            strcpy(s->err.message, "ran out of rows");
            return -1;
        }
    }
    jpeg_finish_decompress(&s->dinfo);
    resize_columns(&s->vertical, s->pixels, in_width, height, s->turned, s->sums, s->clipped);
    resize_columns(&s->horizontal, s->turned, height, width, s->out, s->sums, s->clipped);

    jpeg_create_compress(&s->cinfo);
    s->have_cinfo = 1;
    jpeg_mem_dest(&s->cinfo, &s->jpeg, &s->jpeg_size);
    s->cinfo.image_width = (JDIMENSION)width;
    s->cinfo.image_height = (JDIMENSION)height;
    s->cinfo.input_components = CHANNELS;
    s->cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&s->cinfo); /* YCbCr 4:2:0, Huffman tables not optimized, baseline */
    jpeg_set_quality(&s->cinfo, quality, TRUE);
    jpeg_start_compress(&s->cinfo, TRUE);
    while (s->cinfo.next_scanline < s->cinfo.image_height) {
        JSAMPROW rows[1] = {s->out + (size_t)s->cinfo.next_scanline * stride};
        jpeg_write_scanlines(&s->cinfo, rows, 1);
    }
    jpeg_finish_compress(&s->cinfo);
    return 0;
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
    free(s);
    PyBuffer_Release(&data);
    return out;
}

static PyMethodDef methods[] = {
    {"shrink", shrink, METH_VARARGS,
     "shrink(data, scale_num, width, height, quality) -> bytes: the JPEG decoded at scale_num/8 (1..8), resized to "
     "width x height with an antialiased bilinear filter and encoded as a baseline 4:2:0 JPEG at quality (1..100)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "imgpipe._jpeg_shrink",
    "A JPEG shrunk to a given size and re-encoded, in one pass of libjpeg-turbo.", -1, methods, NULL, NULL, NULL, NULL,
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
