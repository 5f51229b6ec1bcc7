# 10M URL-like strings: three hosts, a 60-byte shared path, then a short varying tail; an id.
import pyarrow as pa, pyarrow.parquet as pq, numpy as np, sys
n = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000_000
rng = np.random.default_rng(7)
hosts = ["https://www.example.com", "https://shop.example.org", "https://api.example.net"]
path = "/catalog/products/electronics/computers/laptops/gaming/item?id="
h = rng.integers(0, 3, n); a = rng.integers(0, 1_000_000, n)
urls = [f"{hosts[x]}{path}{y}" for x, y in zip(h, a)]
t = pa.table({"url": pa.array(urls, pa.string()), "id": pa.array(np.arange(n, dtype=np.int64)), "v": pa.array(rng.integers(0, 1 << 62, n))})
pq.write_table(t, sys.argv[1], row_group_size=1 << 20)
