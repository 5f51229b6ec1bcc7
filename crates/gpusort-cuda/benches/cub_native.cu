// cub_native.cu: CUB's device radix sort called from CUDA C++, the anchor that gpusort's kernels
// are measured against (the `paper` bench divides by CUB's time: `paper --cub FILE`).
//
// Build and run on the GPU machine (a CUDA toolkit with nvcc; CUB comes with it, in CCCL):
//
//   nvcc -O3 -std=c++17 -arch=sm_90 cub_native.cu -o cub_native
//   ./cub_native                      # the table on stdout
//   ./cub_native --json cub.json      # and the figures as JSON, in the layout cub_baseline.py writes
//
// Options: --reps R (timed runs per case, default 10), --warmup W (untimed runs first, default 2),
// --keys N,N (keys-only sorts, default 10000000,100000000), --pairs N,N (key + index sorts,
// default 100000000), --records N (default 10000000), --fields M,M (payload fields, default 2,20).
// -arch=sm_90 is the H100; use the GPU's own compute capability elsewhere.
//
// Cases, all with the data already in GPU memory and random keys over all their bits:
//   keys      SortKeys of n u32 keys and of n u64 keys;
//   pairs     SortPairs of n u32 keys with their u32 row index (what an indirect sort starts with);
//   records   n records of a u32 key and m u32 payload fields, sorted the indirect way with CUB:
//             SortPairs(key, row index), then the payload moved through the sorted index:
//               ByField  m arrays of one field each, one gather kernel over all of them;
//               Hybrid   one row-major n x m array, a thread per row copying it in vector pieces.
// A figure is the minimum and the median over R runs, each timed by a pair of cudaEvents around
// it on the default stream. Every result is checked (keys in order, payload where the index says).
//
// JSON: {"tool", "gpu", "cub_version", "reps", "keys": [...], "records": [...]}; one "keys"
// object per n with sort_u32_ms, sort_u64_ms and, for the pairs, argsort_u32_ms (the name
// cub_baseline.py gives CuPy's argsort, which runs the same SortPairs), each with a *_median_ms;
// one "records" object per m with n, fields, byfield_ms and hybrid_ms (and medians).

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#define CUDA_OK(call) check_cuda((call), #call, __FILE__, __LINE__)

static void check_cuda(cudaError_t status, const char *what, const char *file, int line) {
    if (status != cudaSuccess) {
        std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, what, cudaGetErrorString(status));
        std::exit(1);
    }
}

[[noreturn]] static void fail(const std::string &message) {
    std::fprintf(stderr, "cub_native: %s\n", message.c_str());
    std::exit(1);
}

// ---------------------------------------------------------------------------------------------
// Device memory and timing

// A device array of `count` elements, freed when it goes out of scope.
template <typename T>
class DeviceArray {
  public:
    explicit DeviceArray(size_t count) : count_(count) {
        CUDA_OK(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(T)));
    }
    ~DeviceArray() { cudaFree(data_); }
    DeviceArray(const DeviceArray &) = delete;
    DeviceArray &operator=(const DeviceArray &) = delete;

    T *get() const { return data_; }
    size_t size() const { return count_; }

    std::vector<T> to_host() const {
        std::vector<T> host(count_);
        CUDA_OK(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }

  private:
    T *data_ = nullptr;
    size_t count_;
};

struct Timing {
    double min_ms = 0;
    double median_ms = 0;
};

struct Options {
    int reps = 10;
    int warmup = 2;
    std::vector<size_t> keys = {10000000, 100000000};
    std::vector<size_t> pairs = {100000000};
    size_t records = 10000000;
    std::vector<size_t> fields = {2, 20};
    std::string json;
};

// Runs `work` (which only enqueues GPU work on the default stream) `warmup` times, then times it
// `reps` times with a pair of events around each run.
template <typename Work>
static Timing time_on_gpu(const Options &options, Work &&work) {
    cudaEvent_t begin, end;
    CUDA_OK(cudaEventCreate(&begin));
    CUDA_OK(cudaEventCreate(&end));
    for (int i = 0; i < options.warmup; ++i) work();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < options.reps; ++i) {
        CUDA_OK(cudaEventRecord(begin));
        work();
        CUDA_OK(cudaEventRecord(end));
        CUDA_OK(cudaEventSynchronize(end));
        float elapsed = 0;
        CUDA_OK(cudaEventElapsedTime(&elapsed, begin, end));
        ms.push_back(elapsed);
    }
    CUDA_OK(cudaGetLastError());  // a kernel launch that failed
    CUDA_OK(cudaEventDestroy(begin));
    CUDA_OK(cudaEventDestroy(end));
    std::sort(ms.begin(), ms.end());
    const size_t k = ms.size();
    Timing t;
    t.min_ms = ms.front();
    t.median_ms = k % 2 == 1 ? ms[k / 2] : 0.5 * (ms[k / 2 - 1] + ms[k / 2]);
    return t;
}

// ---------------------------------------------------------------------------------------------
// Kernels: inputs and gathers

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items.
static unsigned blocks_for(size_t n) {
    return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 1u << 20));
}

// A bijective 32-bit mixing function (xor-shift and multiply rounds): random-looking values from
// an index.
__device__ __forceinline__ uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

__global__ void random_u32_kernel(uint32_t *out, size_t n, uint32_t seed) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = hash32(hash32(static_cast<uint32_t>(i) + seed * 0x9e3779b9U) ^ static_cast<uint32_t>(i >> 32));
    }
}

__global__ void random_u64_kernel(uint64_t *out, size_t n, uint32_t seed) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint32_t low = hash32(static_cast<uint32_t>(i) + seed * 0x9e3779b9U);
        const uint32_t high = hash32(low ^ 0xa5a5a5a5U ^ seed);
        out[i] = (static_cast<uint64_t>(high) << 32) | low;
    }
}

__global__ void index_kernel(uint32_t *out, size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = static_cast<uint32_t>(i);
    }
}

// ByField: column blockIdx.y of `out` gets that column of `in` in the order of `order`.
__global__ void gather_columns_kernel(const uint32_t *const *in, uint32_t *const *out, const uint32_t *order,
                                      size_t n) {
    const uint32_t *src = in[blockIdx.y];
    uint32_t *dst = out[blockIdx.y];
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = src[order[i]];
    }
}

// Hybrid: row i of `out` is row order[i] of `in`; a row is `per_row` vectors of type V.
template <typename V>
__global__ void gather_rows_kernel(const V *in, V *out, const uint32_t *order, size_t n, int per_row) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const V *src = in + static_cast<size_t>(order[i]) * per_row;
        V *dst = out + i * per_row;
        for (int v = 0; v < per_row; ++v) dst[v] = src[v];
    }
}

static void fill_random(uint32_t *out, size_t n, uint32_t seed) {
    random_u32_kernel<<<blocks_for(n), kThreads>>>(out, n, seed);
    CUDA_OK(cudaGetLastError());
}

static void fill_random(uint64_t *out, size_t n, uint32_t seed) {
    random_u64_kernel<<<blocks_for(n), kThreads>>>(out, n, seed);
    CUDA_OK(cudaGetLastError());
}

static void fill_index(uint32_t *out, size_t n) {
    index_kernel<<<blocks_for(n), kThreads>>>(out, n);
    CUDA_OK(cudaGetLastError());
}

// Rows of m u32 fields moved in the widest vectors that divide a row (16, 8 or 4 bytes).
static void gather_rows(const uint32_t *in, uint32_t *out, const uint32_t *order, size_t n, int m) {
    if (m % 4 == 0) {
        gather_rows_kernel<uint4><<<blocks_for(n), kThreads>>>(reinterpret_cast<const uint4 *>(in),
                                                               reinterpret_cast<uint4 *>(out), order, n, m / 4);
    } else if (m % 2 == 0) {
        gather_rows_kernel<uint2><<<blocks_for(n), kThreads>>>(reinterpret_cast<const uint2 *>(in),
                                                               reinterpret_cast<uint2 *>(out), order, n, m / 2);
    } else {
        gather_rows_kernel<uint32_t><<<blocks_for(n), kThreads>>>(in, out, order, n, m);
    }
}

// ---------------------------------------------------------------------------------------------
// Checks

template <typename K>
static void check_sorted(const DeviceArray<K> &keys, const char *what) {
    const std::vector<K> host = keys.to_host();
    if (!std::is_sorted(host.begin(), host.end())) fail(std::string(what) + ": the keys are not in order");
}

// Every `step`-th row: the sorted key is the input key at the index, and so is each field.
static void check_gathered(const std::vector<uint32_t> &key_in, const std::vector<uint32_t> &key_out,
                           const std::vector<uint32_t> &index_out, size_t step,
                           const std::vector<std::vector<uint32_t>> &fields_in,
                           const std::vector<std::vector<uint32_t>> &fields_out, const char *what) {
    for (size_t i = 0; i < key_out.size(); i += step) {
        const uint32_t from = index_out[i];
        bool ok = from < key_in.size() && key_in[from] == key_out[i];
        for (size_t c = 0; ok && c < fields_in.size(); ++c) ok = fields_in[c][from] == fields_out[c][i];
        if (!ok) fail(std::string(what) + ": row " + std::to_string(i) + " is not where the index says");
    }
}

static int as_int_count(size_t n) {
    if (n > static_cast<size_t>(INT_MAX)) fail("at most " + std::to_string(INT_MAX) + " items per sort");
    return static_cast<int>(n);
}

// ---------------------------------------------------------------------------------------------
// Cases

template <typename K>
static Timing sort_keys(const Options &options, size_t n) {
    DeviceArray<K> in(n), out(n);
    fill_random(in.get(), n, 1);
    const int count = as_int_count(n);
    size_t temp_bytes = 0;
    CUDA_OK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, in.get(), out.get(), count));
    DeviceArray<unsigned char> temp(temp_bytes);
    const Timing t = time_on_gpu(options, [&] {
        CUDA_OK(cub::DeviceRadixSort::SortKeys(temp.get(), temp_bytes, in.get(), out.get(), count));
    });
    check_sorted(out, sizeof(K) == 4 ? "SortKeys u32" : "SortKeys u64");
    return t;
}

static Timing sort_pairs(const Options &options, size_t n) {
    DeviceArray<uint32_t> key_in(n), key_out(n), index_in(n), index_out(n);
    fill_random(key_in.get(), n, 2);
    fill_index(index_in.get(), n);
    const int count = as_int_count(n);
    size_t temp_bytes = 0;
    CUDA_OK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, key_in.get(), key_out.get(), index_in.get(),
                                            index_out.get(), count));
    DeviceArray<unsigned char> temp(temp_bytes);
    const Timing t = time_on_gpu(options, [&] {
        CUDA_OK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, key_in.get(), key_out.get(),
                                                index_in.get(), index_out.get(), count));
    });
    check_sorted(key_out, "SortPairs u32 + index");
    check_gathered(key_in.to_host(), key_out.to_host(), index_out.to_host(), 1, {}, {}, "SortPairs u32 + index");
    return t;
}

struct RecordTimings {
    Timing byfield;
    Timing hybrid;
};

static RecordTimings sort_records(const Options &options, size_t n, int m) {
    DeviceArray<uint32_t> key_in(n), key_out(n), index_in(n), index_out(n);
    fill_random(key_in.get(), n, 3);
    fill_index(index_in.get(), n);
    const int count = as_int_count(n);
    size_t temp_bytes = 0;
    CUDA_OK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, key_in.get(), key_out.get(), index_in.get(),
                                            index_out.get(), count));
    DeviceArray<unsigned char> temp(temp_bytes);
    auto sort = [&] {
        CUDA_OK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, key_in.get(), key_out.get(),
                                                index_in.get(), index_out.get(), count));
    };
    const size_t check_step = 997;  // rows checked on the host: every 997th
    RecordTimings result;

    {  // ByField: one array per field.
        std::vector<std::unique_ptr<DeviceArray<uint32_t>>> in, out;
        std::vector<const uint32_t *> in_ptrs;
        std::vector<uint32_t *> out_ptrs;
        for (int c = 0; c < m; ++c) {
            in.push_back(std::make_unique<DeviceArray<uint32_t>>(n));
            out.push_back(std::make_unique<DeviceArray<uint32_t>>(n));
            fill_random(in.back()->get(), n, 100 + c);
            in_ptrs.push_back(in.back()->get());
            out_ptrs.push_back(out.back()->get());
        }
        DeviceArray<const uint32_t *> in_table(m);
        DeviceArray<uint32_t *> out_table(m);
        CUDA_OK(cudaMemcpy(in_table.get(), in_ptrs.data(), m * sizeof(const uint32_t *), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(out_table.get(), out_ptrs.data(), m * sizeof(uint32_t *), cudaMemcpyHostToDevice));
        const dim3 grid(blocks_for(n), static_cast<unsigned>(m));
        result.byfield = time_on_gpu(options, [&] {
            sort();
            gather_columns_kernel<<<grid, kThreads>>>(in_table.get(), out_table.get(), index_out.get(), n);
        });
        check_sorted(key_out, "records ByField");
        // The first and the last field.
        std::vector<std::vector<uint32_t>> fields_in = {in.front()->to_host(), in.back()->to_host()};
        std::vector<std::vector<uint32_t>> fields_out = {out.front()->to_host(), out.back()->to_host()};
        check_gathered(key_in.to_host(), key_out.to_host(), index_out.to_host(), check_step, fields_in, fields_out,
                       "records ByField");
    }

    {  // Hybrid: the fields of a record side by side, one row-major array.
        DeviceArray<uint32_t> rows_in(n * m), rows_out(n * m);
        fill_random(rows_in.get(), n * m, 200);
        result.hybrid = time_on_gpu(options, [&] {
            sort();
            gather_rows(rows_in.get(), rows_out.get(), index_out.get(), n, m);
        });
        CUDA_OK(cudaGetLastError());
        check_sorted(key_out, "records Hybrid");
        const std::vector<uint32_t> all_in = rows_in.to_host(), all_out = rows_out.to_host();
        const std::vector<uint32_t> index = index_out.to_host();
        for (size_t i = 0; i < n; i += check_step) {
            for (int c = 0; c < m; ++c) {
                if (all_out[i * m + c] != all_in[static_cast<size_t>(index[i]) * m + c]) {
                    fail("records Hybrid: row " + std::to_string(i) + " is not where the index says");
                }
            }
        }
    }
    return result;
}

// ---------------------------------------------------------------------------------------------
// Command line and output

static std::vector<size_t> parse_list(const char *flag, const char *text) {
    std::vector<size_t> values;
    std::string item;
    for (const char *p = text;; ++p) {
        if (*p == ',' || *p == '\0') {
            char *end = nullptr;
            const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
            if (item.empty() || *end != '\0' || v == 0) fail(std::string(flag) + ": bad number '" + item + "'");
            values.push_back(static_cast<size_t>(v));
            item.clear();
            if (*p == '\0') break;
        } else {
            item += *p;
        }
    }
    return values;
}

static Options parse_options(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            std::printf("cub_native [--reps R] [--warmup W] [--keys N,..] [--pairs N,..] [--records N] "
                        "[--fields M,..] [--json FILE]\n");
            std::exit(0);
        }
        if (i + 1 >= argc) fail(flag + " needs a value (--help lists the options)");
        const char *value = argv[++i];
        if (flag == "--reps") {
            o.reps = static_cast<int>(parse_list("--reps", value).at(0));
        } else if (flag == "--warmup") {
            o.warmup = std::atoi(value);
        } else if (flag == "--keys") {
            o.keys = parse_list("--keys", value);
        } else if (flag == "--pairs") {
            o.pairs = parse_list("--pairs", value);
        } else if (flag == "--records") {
            o.records = parse_list("--records", value).at(0);
        } else if (flag == "--fields") {
            o.fields = parse_list("--fields", value);
        } else if (flag == "--json") {
            o.json = value;
        } else {
            fail("unknown option " + flag + " (--help lists the options)");
        }
    }
    if (o.reps < 1 || o.warmup < 0) fail("--reps must be at least 1 and --warmup at least 0");
    return o;
}

static std::string json_string(const std::string &s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out + "\"";
}

struct KeyFigures {
    bool has_keys = false, has_pairs = false;
    Timing u32, u64, pairs;
};

static void print_row(const char *what, size_t n, const Timing &t, bool rate) {
    std::printf("| %-50s | %10zu | %9.3f | %9.3f |", what, n, t.min_ms, t.median_ms);
    if (rate) {
        std::printf(" %7.2f |\n", n / t.min_ms / 1e6);
    } else {
        std::printf("       - |\n");
    }
}

int main(int argc, char **argv) {
    const Options options = parse_options(argc, argv);
    int device = 0;
    CUDA_OK(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, device));
    const int v = CUB_VERSION;  // major * 100000 + minor * 100 + patch
    std::printf("# CUB %d.%d.%d on %s: min and median of %d runs after %d warm-up runs, ms\n", v / 100000,
                v / 100 % 1000, v % 100, prop.name, options.reps, options.warmup);
    std::printf("| %-50s | %10s | %9s | %9s | %7s |\n", "case", "n", "min ms", "median ms", "Gkeys/s");
    std::printf("| --- | ---: | ---: | ---: | ---: |\n");
    std::fflush(stdout);

    std::map<size_t, KeyFigures> keys;
    for (size_t n : options.keys) {
        KeyFigures &k = keys[n];
        k.has_keys = true;
        k.u32 = sort_keys<uint32_t>(options, n);
        print_row("SortKeys u32", n, k.u32, true);
        k.u64 = sort_keys<uint64_t>(options, n);
        print_row("SortKeys u64", n, k.u64, true);
        std::fflush(stdout);
    }
    for (size_t n : options.pairs) {
        KeyFigures &k = keys[n];
        k.has_pairs = true;
        k.pairs = sort_pairs(options, n);
        print_row("SortPairs u32 key + u32 index", n, k.pairs, true);
        std::fflush(stdout);
    }
    std::vector<std::pair<size_t, RecordTimings>> records;
    for (size_t m : options.fields) {
        if (m > 65535) fail("--fields: at most 65535 fields");
        const RecordTimings r = sort_records(options, options.records, static_cast<int>(m));
        records.emplace_back(m, r);
        const std::string byfield = "records ByField m=" + std::to_string(m) + " (SortPairs + column gather)";
        const std::string hybrid = "records Hybrid m=" + std::to_string(m) + " (SortPairs + row gather)";
        print_row(byfield.c_str(), options.records, r.byfield, false);
        print_row(hybrid.c_str(), options.records, r.hybrid, false);
        std::fflush(stdout);
    }

    if (!options.json.empty()) {
        FILE *f = std::fopen(options.json.c_str(), "w");
        if (!f) fail("cannot write " + options.json);
        std::fprintf(f, "{\n \"tool\": \"cub_native\",\n \"gpu\": %s,\n \"cub_version\": %d,\n \"reps\": %d,\n",
                     json_string(prop.name).c_str(), v, options.reps);
        std::fprintf(f, " \"keys\": [");
        bool first = true;
        for (const auto &[n, k] : keys) {
            std::fprintf(f, "%s\n  {\"n\": %zu", first ? "" : ",", n);
            if (k.has_keys) {
                std::fprintf(f, ", \"sort_u32_ms\": %.4f, \"sort_u32_median_ms\": %.4f", k.u32.min_ms,
                             k.u32.median_ms);
                std::fprintf(f, ", \"sort_u64_ms\": %.4f, \"sort_u64_median_ms\": %.4f", k.u64.min_ms,
                             k.u64.median_ms);
            }
            if (k.has_pairs) {
                std::fprintf(f, ", \"argsort_u32_ms\": %.4f, \"argsort_u32_median_ms\": %.4f", k.pairs.min_ms,
                             k.pairs.median_ms);
            }
            std::fprintf(f, "}");
            first = false;
        }
        std::fprintf(f, "\n ],\n \"records\": [");
        first = true;
        for (const auto &[m, r] : records) {
            std::fprintf(f,
                         "%s\n  {\"n\": %zu, \"fields\": %zu, \"byfield_ms\": %.4f, \"byfield_median_ms\": %.4f, "
                         "\"hybrid_ms\": %.4f, \"hybrid_median_ms\": %.4f}",
                         first ? "" : ",", options.records, m, r.byfield.min_ms, r.byfield.median_ms,
                         r.hybrid.min_ms, r.hybrid.median_ms);
            first = false;
        }
        std::fprintf(f, "\n ]\n}\n");
        std::fclose(f);
        std::printf("# wrote %s\n", options.json.c_str());
    }
    return 0;
}
