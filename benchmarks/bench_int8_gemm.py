"""The int8 product's two kernels side by side on this CPU (pipeline/reference/int8_gemm.py):
``torch._int_mm`` and the exact float GEMM on the same integers, at the row counts the engine
runs (one sequence's step, a chain's verify, batched verifies, a prompt) and the tiny models'
projection shapes, plus the kernel the engine would choose here.

Writes ``benchmarks/results/int8-gemm.json`` (provenance; per shape both times, best of the
interleaved repeats, and float ÷ int_mm). One thread, as the configs run the engine.
Usage: ``python benchmarks/bench_int8_gemm.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above

ROWS = (1, 2, 6, 8, 17, 48, 128)
SHAPES = ((256, 768), (256, 1344), (672, 256), (768, 256))  # (in, out): fused qkv, gate_up, down, EAGLE-3's fc


def _time(fn, calls: int = 5) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(rows: int, shape: tuple[int, int], repeats: int) -> dict:
    import torch  # only the measurement needs it

    from pipeline.reference.int8_gemm import FLOAT32_EXACT_IN, int8_product

    gen = torch.Generator().manual_seed(rows)
    x = torch.randint(-127, 128, (rows, shape[0]), dtype=torch.int8, generator=gen)
    weight = torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen)
    as_float = weight.to(torch.float32 if shape[0] <= FLOAT32_EXACT_IN else torch.float64)
    assert torch.equal(int8_product(x, weight), int8_product(x, as_float))  # the same bits, or no figure
    int_mm, floats = [], []
    for _ in range(repeats):  # interleaved, so a slow moment of the host hits both
        int_mm.append(_time(lambda: int8_product(x, weight)))
        floats.append(_time(lambda: int8_product(x, as_float)))
    best_int, best_float = min(int_mm), min(floats)
    return {"rows": rows, "in": shape[0], "out": shape[1], "int_mm_us": round(best_int * 1e6, 2),
            "float_us": round(best_float * 1e6, 2), "float_over_int_mm": round(best_float / best_int, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "int8-gemm.json")
    args = parser.parse_args()
    import torch  # only the measurement needs it

    from pipeline.reference import int8_gemm

    torch.set_num_threads(1)
    rows = [measure(r, s, args.repeats) for s in SHAPES for r in ROWS]
    out = {"what": "int8 × int8 product: torch._int_mm against the exact float GEMM on the same integers, one thread",
           "provenance": result_provenance(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "torch": torch.__version__, "engine_kernel": int8_gemm.kernel(), "rows": rows}
    args.output.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    for r in rows:
        print(f"{r['rows']:>4} × {r['in']}→{r['out']}: _int_mm {r['int_mm_us']:.0f} µs, float {r['float_us']:.0f} µs "
              f"(float ÷ _int_mm {r['float_over_int_mm']:.3f})", file=sys.stderr)
    print(f"engine kernel here: {out['engine_kernel']}; wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
