"""Local node and custodian figures: pod create -> bound/Running/Ready, proxy latency."""

from corral_dev._node_bench import bench_custodian, bench_node

if __name__ == "__main__":
    bench_custodian()
    bench_node()
