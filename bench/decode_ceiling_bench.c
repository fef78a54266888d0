/* The machine's JPEG decode ceiling: plain libjpeg-turbo full decodes
 * (tjDecompress2 to packed RGB, no scaling, no resize) of one file, on N
 * threads at once, each with its own handle and output buffer, for a fixed
 * wall time. What a front door that decodes every photo can at best reach
 * on the same cores (issue 25 item 6: squishd's JPEG path >= 90% of this).
 *
 *   squish-decode-ceiling --jpeg FILE [--threads N] [--duration S] [--scale N/D]
 *
 * --scale N/D decodes with libjpeg-turbo's DCT scaling at N/D (as squishd
 * does when the image is at least twice the model's input: 1/2 for 512x600
 * to 224x224), still to RGB and with no resize after it.
 *
 * Prints one JSON line: images decoded, images per second, per thread, and
 * the CPU time the decoding threads used (cpu_s, each thread's own clock
 * from its start to its end): on a machine shared with other work, images
 * per CPU second is what the decoder costs, whatever share of the cores
 * the run got. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>

typedef struct {
    const unsigned char *jpeg;
    unsigned long len;
    double duration_s;
    tjscalingfactor sf;
    long done;
    double cpu_s;
    int failed;
    pthread_t thread;
} job_t;

static atomic_int go;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *decode_loop(void *arg)
{
    job_t *j = arg;
    tjhandle tj = tjInitDecompress();
    int w = 0, h = 0, sub = 0, cs = 0;
    if (tj == NULL || tjDecompressHeader3(tj, j->jpeg, j->len, &w, &h, &sub, &cs) != 0) {
        j->failed = 1;
        return NULL;
    }
    w = TJSCALED(w, j->sf);
    h = TJSCALED(h, j->sf);
    unsigned char *pix = malloc((size_t)w * (size_t)h * 3);
    if (pix == NULL) {
        j->failed = 1;
        return NULL;
    }
    while (!atomic_load(&go))
        ;
    double end = now_s() + j->duration_s, cpu0 = thread_cpu_s();
    while (now_s() < end) {
        if (tjDecompress2(tj, j->jpeg, j->len, pix, w, 0, h, TJPF_RGB, 0) != 0) {
            j->failed = 1;
            break;
        }
        j->done++;
    }
    j->cpu_s = thread_cpu_s() - cpu0;
    free(pix);
    tjDestroy(tj);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int threads = 1;
    double duration = 5;
    tjscalingfactor sf = {1, 1};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--jpeg") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--duration") == 0 && i + 1 < argc) {
            duration = atof(argv[++i]);
        } else if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc &&
                   sscanf(argv[++i], "%d/%d", &sf.num, &sf.denom) == 2 && sf.num > 0 &&
                   sf.denom > 0) {
            continue;
        } else {
            path = NULL;
            break;
        }
    }
    if (path == NULL || threads < 1 || threads > 256 || duration <= 0) {
        fprintf(stderr, "usage: %s --jpeg FILE [--threads N] [--duration S] [--scale N/D]\n",
                argv[0]);
        return 2;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = len > 0 ? malloc((size_t)len) : NULL;
    if (data == NULL || fread(data, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "%s: cannot read\n", path);
        return 1;
    }
    fclose(f);
    job_t *jobs = calloc((size_t)threads, sizeof(*jobs));
    if (jobs == NULL)
        return 1;
    for (int i = 0; i < threads; i++) {
        jobs[i] =
            (job_t){.jpeg = data, .len = (unsigned long)len, .duration_s = duration, .sf = sf};
        if (pthread_create(&jobs[i].thread, NULL, decode_loop, &jobs[i]) != 0)
            return 1;
    }
    double t0 = now_s();
    atomic_store(&go, 1);
    long total = 0;
    double cpu = 0;
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(jobs[i].thread, NULL);
        total += jobs[i].done;
        cpu += jobs[i].cpu_s;
        failed |= jobs[i].failed;
    }
    double wall = now_s() - t0;
    if (failed) {
        fprintf(stderr, "%s: decode failed\n", path);
        return 1;
    }
    printf("{\"threads\": %d, \"scale\": \"%d/%d\", \"duration_s\": %.3f, \"images\": %ld, "
           "\"images_per_s\": %.1f, \"cpu_s\": %.3f, \"images_per_cpu_s\": %.1f, "
           "\"per_thread\": [",
           threads, sf.num, sf.denom, wall, total, (double)total / wall, cpu,
           cpu > 0 ? (double)total / cpu : 0.0);
    for (int i = 0; i < threads; i++)
        printf("%s%ld", i ? ", " : "", jobs[i].done);
    printf("]}\n");
    free(jobs);
    free(data);
    return 0;
}
