// Prototype: how fast can the host stage Arrow-like column pieces into pinned memory?
// Mirrors the session's uploader (session.rs `stage`): 10M rows x 21 u32 columns, batches of
// 8192 rows, segments of ~32 MB, 3 pinned staging slots, each slot uploaded after staging.
// Variants: threads, memcpy vs non-temporal stores, with/without the DMA running.
// Build: nvcc -O3 -Xcompiler -fopenmp,-mavx2 proto_stage.cu -o proto_stage
#include <cuda_runtime.h>
#include <omp.h>
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static void nt_copy(char* dst, const char* src, size_t n) {
    size_t i = 0;
    // dst alignment: align to 32 with a plain copy first
    size_t head = (32 - ((uintptr_t)dst & 31)) & 31;
    if (head > n) head = n;
    memcpy(dst, src, head); i = head;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i*)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i*)(src + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i*)(src + i + 64));
        __m256i d = _mm256_loadu_si256((const __m256i*)(src + i + 96));
        _mm256_stream_si256((__m256i*)(dst + i), a);
        _mm256_stream_si256((__m256i*)(dst + i + 32), b);
        _mm256_stream_si256((__m256i*)(dst + i + 64), c);
        _mm256_stream_si256((__m256i*)(dst + i + 96), d);
    }
    memcpy(dst + i, src + i, n - i);
}

int main() {
    const size_t rows = 10000000, cols = 21, w = 4, batch = 8192;
    const size_t seg_rows = (32u << 20) / (cols * w) / 64 * 64;
    const size_t seg_bytes = seg_rows * cols * w;
    std::vector<char*> src(cols);
    for (auto& s : src) { s = (char*)aligned_alloc(64, rows * w); memset(s, 1, rows * w); }
    char* slots[3];
    for (auto& s : slots) { cudaHostAlloc((void**)&s, seg_bytes, cudaHostAllocPortable); memset(s, 0, seg_bytes); }
    char* heap_slots[3];
    for (auto& s : heap_slots) { s = (char*)aligned_alloc(4096, seg_bytes); memset(s, 0, seg_bytes); }
    char* dev; cudaMalloc(&dev, rows * cols * w);
    cudaStream_t st; cudaStreamCreate(&st);
    cudaEvent_t ev[3]; for (auto& e : ev) cudaEventCreate(&e);
    size_t nseg = (rows + seg_rows - 1) / seg_rows;
    printf("rows %zu cols %zu segment %zu rows (%.1f MB), %zu segments, omp max threads %d\n",
           rows, cols, seg_rows, seg_bytes / 1e6, nseg, omp_get_max_threads());
    for (int pinned = 1; pinned >= 0; --pinned)
    for (int dma = 1; dma >= 0; --dma)
    for (int nt = 0; nt <= 1; ++nt)
    for (int task_kb : {32, 1536})
    for (int threads : {1, 4, 8, 16}) {
        if (!pinned && dma) continue;
        omp_set_num_threads(threads);
        double best = 1e9;
        for (int rep = 0; rep < 3; ++rep) {
            cudaDeviceSynchronize();
            auto t0 = std::chrono::steady_clock::now();
            for (size_t j = 0; j < nseg; ++j) {
                int s = j % 3;
                char* buf = pinned ? slots[s] : heap_slots[s];
                if (dma) cudaEventSynchronize(ev[s]);
                size_t r0 = j * seg_rows, n = std::min(seg_rows, rows - r0);
                // tasks: (column, piece) where a piece is within one batch (32 KB) or a whole
                // column of the segment when the source were contiguous (1.5 MB)
                size_t piece = task_kb == 32 ? batch : n;
                size_t npieces = (n + piece - 1) / piece;
                #pragma omp parallel for schedule(dynamic)
                for (size_t t = 0; t < cols * npieces; ++t) {
                    size_t c = t / npieces, p = t % npieces;
                    size_t a = p * piece, len = std::min(piece, n - a);
                    char* d = buf + c * n * w + a * w;
                    const char* sp = src[c] + (r0 + a) * w;
                    if (nt) nt_copy(d, sp, len * w); else memcpy(d, sp, len * w);
                }
                if (nt) _mm_sfence();
                if (dma) {
                    cudaMemcpyAsync(dev + r0 * cols * w, buf, n * cols * w, cudaMemcpyHostToDevice, st);
                    cudaEventRecord(ev[s], st);
                }
            }
            cudaStreamSynchronize(st);
            double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (ms < best) best = ms;
        }
        printf("%s dma=%d %s task=%4d KB threads=%2d: %7.2f ms  %6.1f GB/s\n", pinned ? "pinned" : "heap  ", dma,
               nt ? "nt-store" : "memcpy  ", task_kb, threads, best, rows * cols * w / best / 1e6);
    }
    return 0;
}
