"""`make bench`: run every benchmark and print its JSON result (one document per line)."""

import orjson

from bench import conversion

BENCHMARKS = [conversion.run]


def main() -> None:
    for benchmark in BENCHMARKS:
        print(orjson.dumps(benchmark()).decode(), flush=True)


if __name__ == "__main__":
    main()
