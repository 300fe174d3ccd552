/*
 * imgpipe.image._jpeg_region: one region of a JPEG decoded by libjpeg-turbo, skipping the rest.
 *
 * decode_region(data, left, top, width, height, reduction) -> bytearray
 * LIBJPEG_TURBO_VERSION: the version it was built against, e.g. "2.1.5"
 *
 * The image is decoded at 1/reduction of its size in the DCT domain (1, 2, 4 or 8, as Pillow's
 * draft does it); of that image, only the rows top..top+height are produced and only the
 * iMCU columns around left..left+width are transformed (jpeg_skip_scanlines,
 * jpeg_crop_scanline), which is how DALI's and TensorFlow's CPU decoders cut a random crop.
 * One column of chroma-upsampling context is decoded on each side of the region, so its
 * pixels are exactly those of a full decode. The result is height x width x 3 RGB bytes.
 *
 * Any libjpeg error or warning (corrupt data that libjpeg would paper over with gray, an
 * unsupported colour space such as CMYK) raises ValueError with libjpeg's message: the caller
 * then hands the record to Pillow, which decodes it or says why not. Memory: the output is
 * allocated only once the header has shown the region to lie inside the image; the caller
 * checks the header's pixel count against its decompression-bomb limit first. The GIL is
 * released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "imgpipe's region decoder needs libjpeg-turbo >= 1.5 (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

#define CHANNELS 3
#define UPSAMPLING_CONTEXT 2 /* columns decoded past the region's right edge; one before its left edge */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} RegionError;

typedef struct {
    struct jpeg_decompress_struct cinfo;
    RegionError err;
    JSAMPLE *row; /* one decoded row of the cropped columns */
} Decoder;

typedef struct {
    JDIMENSION left, top, width, height;
} Region;

static void escape(j_common_ptr cinfo) {
    RegionError *err = (RegionError *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

/* Warnings (level -1) escape too; trace messages (level >= 0) are dropped. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) {
        escape(cinfo);
    }
}

/* The header, read at 1/reduction scale; 0, or -1 with err.message set. No Python calls. */
static int read_header(Decoder *d, const unsigned char *data, size_t size, int reduction) {
    if (setjmp(d->err.escape)) {
        return -1;
    }
    jpeg_mem_src(&d->cinfo, data, (unsigned long)size);
    jpeg_read_header(&d->cinfo, TRUE);
    d->cinfo.out_color_space = JCS_RGB;
    d->cinfo.scale_num = 1;
    d->cinfo.scale_denom = (unsigned int)reduction;
    jpeg_calc_output_dimensions(&d->cinfo);
    return 0;
}

/* The region's pixels into out (height x width x 3); 0, or -1 with err.message set. Runs without the GIL. */
static int read_region(Decoder *d, const Region *r, JSAMPLE *out) {
    if (setjmp(d->err.escape)) {
        return -1;
    }
    jpeg_start_decompress(&d->cinfo);
    JDIMENSION first = r->left > 0 ? r->left - 1 : 0;
    JDIMENSION end = r->left + r->width + UPSAMPLING_CONTEXT;
    if (end > d->cinfo.output_width) {
        end = d->cinfo.output_width;
    }
    JDIMENSION columns = end - first;
    jpeg_crop_scanline(&d->cinfo, &first, &columns); /* moves first left to an iMCU boundary */
    d->row = malloc((size_t)columns * CHANNELS);
    if (d->row == NULL) {
        strcpy(d->err.message, "out of memory for one row");
        return -1;
    }
    if (r->top > 0 && jpeg_skip_scanlines(&d->cinfo, r->top) != r->top) {
        strcpy(d->err.message, "could not skip to the region's first row");
        return -1;
    }
    size_t offset = (size_t)(r->left - first) * CHANNELS, stride = (size_t)r->width * CHANNELS;
    for (JDIMENSION y = 0; y < r->height; y++) {
        JSAMPROW rows[1] = {d->row};
        if (jpeg_read_scanlines(&d->cinfo, rows, 1) != 1) {
            strcpy(d->err.message, "ran out of rows before the region's last");
            return -1;
        }
        memcpy(out + y * stride, d->row + offset, stride);
    }
    return 0;
}

static PyObject *decode_region(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer data;
    int left, top, width, height, reduction;
    if (!PyArg_ParseTuple(args, "y*iiiii:decode_region", &data, &left, &top, &width, &height, &reduction)) {
        return NULL;
    }
    if (reduction != 1 && reduction != 2 && reduction != 4 && reduction != 8) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "reduction must be 1, 2, 4 or 8, got %d", reduction);
    }
    Decoder d;
    memset(&d, 0, sizeof d);
    d.cinfo.err = jpeg_std_error(&d.err.pub);
    d.err.pub.error_exit = escape;
    d.err.pub.emit_message = on_message;
    jpeg_create_decompress(&d.cinfo);

    PyObject *out = NULL;
    int status = read_header(&d, data.buf, (size_t)data.len, reduction);
    if (status == 0) {
        if (left < 0 || top < 0 || width < 1 || height < 1 || (JDIMENSION)left + (JDIMENSION)width > d.cinfo.output_width ||
            (JDIMENSION)top + (JDIMENSION)height > d.cinfo.output_height) {
            PyErr_Format(PyExc_ValueError, "region %dx%d at (%d, %d) is not inside the %ux%u image", width, height, left,
                         top, d.cinfo.output_width, d.cinfo.output_height);
        } else if ((size_t)width * (size_t)height > (size_t)PY_SSIZE_T_MAX / CHANNELS) {
            PyErr_Format(PyExc_MemoryError, "region %dx%d is too large for this platform", width, height);
        } else if ((out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)width * height * CHANNELS)) != NULL) {
            Region region = {(JDIMENSION)left, (JDIMENSION)top, (JDIMENSION)width, (JDIMENSION)height};
            JSAMPLE *pixels = (JSAMPLE *)PyByteArray_AS_STRING(out);
            Py_BEGIN_ALLOW_THREADS;
            status = read_region(&d, &region, pixels);
            Py_END_ALLOW_THREADS;
        }
    }
    if (status != 0) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_ValueError, d.err.message);
    }
    free(d.row);
    jpeg_destroy_decompress(&d.cinfo);
    PyBuffer_Release(&data);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, left, top, width, height, reduction) -> bytearray of height x width x 3 RGB bytes: the "
     "region of the JPEG decoded at 1/reduction scale (1, 2, 4 or 8), skipping the rows and iMCU columns outside it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "imgpipe.image._jpeg_region",
    "One region of a JPEG decoded by libjpeg-turbo, skipping the rest.", -1, methods, NULL, NULL, NULL, NULL,
};

#define STRINGIFY(x) #x
#define TOSTRING(x) STRINGIFY(x)

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "LIBJPEG_TURBO_VERSION", TOSTRING(LIBJPEG_TURBO_VERSION)) < 0) {
        Py_CLEAR(m);
    }
    return m;
}
