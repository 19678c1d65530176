#!/usr/bin/env bash
# The user's path, run by CI before the test suite (which installs every extra, and so never sees it):
#   1. build the sdist and wheel and check what they hold (scripts/check_wheel.py);
#   2. install the wheel with no extras in a fresh virtualenv and use it as a user would: --version, serve in
#      each architecture + one curl predict, a short bench + advise, locustfile, k8s (its --out folder must hold
#      what its Dockerfile COPYs, the wheel the same as stage 1's); the commands that need an extra must fail in
#      one line (all at the newest versions the ranges allow, as `make test`'s contract layer is). Then the ranges'
#      other end: one served request per architecture and the in-process contract layer (tests/contract) against
#      the wheel installed at the lowest versions pyproject.toml allows (`uv pip install --resolution
#      lowest-direct`), and `--arch sync` serving a request on each gunicorn release line between the floor's and
#      the newest (`GUNICORN_LINES`);
#   3. each extra in its own fresh virtualenv (made in the background while stage 2 runs, two pips at a time after it),
#      running the command that needs it, two extras at a time; in those of `safe` and `torch`, `twinserve k8s --out`
#      for a skops model with its weights beside its module and for a repository holding a torch model, each
#      Dockerfile replayed step by step with that virtualenv as the image's Python, to one prediction over HTTP
#      (tests/live/deploy/test_k8s_replay.py: no container engine here can pull a base image);
#   4. the README's first command, `make bench`, on a fresh clone of HEAD (in the background, beside stage 3).
# Servers listen on free 127.0.0.1 ports and are stopped by PID with SIGTERM; every step has a deadline.
#
# Environment:
#   USER_PATH_EXTRA_ERRORS=0   skip the checks that commands needing an extra exit 2 with one line naming it
#   USER_PATH_EXTRAS="..."     the extras of stage 3, each in its own virtualenv (default: torch otel locust ray safe)
#   USER_PATH_BASE=0           skip stage 2 (to try stage 3 or 4 alone)
#   USER_PATH_LOWEST=0         skip stage 2's lowest-versions install
#   USER_PATH_CLONE=0          skip stage 4
#   USER_PATH_KEEP=1           keep the work folder (its path is printed) instead of removing it
#   PYTHON                     the interpreter the virtualenvs are made with (default python3)
#   PIP_CACHE_DIR              pip's cache, shared by every virtualenv (default ~/.cache/pip)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
EXTRA_ERRORS=${USER_PATH_EXTRA_ERRORS:-1}
EXTRAS=${USER_PATH_EXTRAS-torch otel locust ray safe}
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pip}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1
# curl and httpx honour *_proxy variables: loopback must never go through one.
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
# A short path: Ray puts unix sockets under TMPDIR, whose paths must stay under 108 bytes.
WORK=$(mktemp -d /tmp/user-path.XXXXXX)
SERVERS=()
BACKGROUND=()
TIMINGS=()
STAGE=setup
START=$EPOCHREALTIME

log() { printf '[user-path %6.1fs] %s\n' "$(elapsed "$START")" "$*"; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
fail() {
    echo "user-path: FAIL: $*" >&2
    exit 1
}

summary() {
    local entry
    echo "user-path: stage timings (seconds)"
    for entry in "${TIMINGS[@]}"; do
        printf '  %-48s %7s\n' "${entry%|*}" "${entry##*|}"
    done
    printf '  %-48s %7s\n' "total" "$(elapsed "$START")"
}

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${BACKGROUND[@]}"; do
        kill_tree "$pid"
    done
    for pid in "${SERVERS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    summary
    if [ "${USER_PATH_KEEP:-0}" = 1 ]; then
        echo "user-path: kept $WORK"
    else
        rm -rf "$WORK"
    fi
    if [ "$rc" -eq 0 ]; then
        echo "user-path: all stages passed"
    else
        echo "user-path: failed (exit $rc) in stage: $STAGE" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# timed NAME COMMAND...: run it, record and print how long it took.
timed() {
    local name=$1 t0=$EPOCHREALTIME
    shift
    STAGE=$name
    log "-- $name"
    "$@"
    TIMINGS+=("$name|$(elapsed "$t0")")
    log "-- $name: $(elapsed "$t0") s"
}

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# new_venv DIR [PIP ARGS...]: a fresh virtualenv with what pip installs from the given arguments.
new_venv() {
    local dir=$1
    shift
    "$PYTHON" -m venv "$dir" || return 1
    if ! timeout 900 "$dir/bin/python" -m pip install -q "$@" >"$dir.pip.log" 2>&1; then
        tail -n 40 "$dir.pip.log" >&2
        echo "user-path: pip install $* into $dir failed" >&2
        return 1
    fi
}

# start_server LOG COMMAND...: run COMMAND in the background (its output in LOG); sets SERVER_PID.
start_server() {
    local out=$1
    shift
    "$@" >"$out" 2>&1 </dev/null &
    SERVER_PID=$!
    SERVERS+=("$SERVER_PID")
}

# wait_ready PORT PID LOG [SECONDS]: poll the readiness endpoint until it answers 200, the server dies or time is up.
wait_ready() {
    local port=$1 pid=$2 out=$3 deadline=$((SECONDS + ${4:-180}))
    until curl -s -f -o /dev/null --max-time 2 "http://127.0.0.1:$port/v2/health/ready"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 40 "$out" >&2
            fail "server $pid (log $out) exited before it was ready"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$out" >&2
            fail "server $pid was not ready on port $port within ${4:-180} s"
        fi
        sleep 0.5
    done
}

# stop_server PID LOG [SECONDS]: SIGTERM, wait for it to exit (it must exit 0 within the deadline).
stop_server() {
    local pid=$1 out=$2 deadline=$((SECONDS + ${3:-60})) rc=0 kept=() p
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null || true
            tail -n 40 "$out" >&2
            fail "server $pid did not exit within ${3:-60} s of SIGTERM"
        fi
        sleep 0.2
    done
    wait "$pid" || rc=$?
    for p in "${SERVERS[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
    SERVERS=("${kept[@]}")
    if [ "$rc" -ne 0 ]; then
        tail -n 40 "$out" >&2
        fail "server $pid exited $rc after SIGTERM"
    fi
}

# predict_iris PORT: the README's curl, exactly as a user types it; the answer must name setosa.
predict_iris() {
    local answer
    answer=$(curl -s -f --max-time 30 "localhost:$1/v1/models/iris:predict" -H 'content-type: application/json' \
        -d '{"instances": [{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}]}') ||
        fail "predict on port $1 failed"
    log "predict: $answer"
    grep -q '"setosa"' <<<"$answer" || fail "the iris answer has no \"setosa\": $answer"
}

# -- 1. build -------------------------------------------------------------------------------------------------
build() {
    # From a copy of the files git tracks or would (setuptools writes an egg-info into the tree it builds).
    mkdir -p "$WORK/source"
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && tar --null -T - -cf -) |
        tar -xf - -C "$WORK/source"
    # uv: for stage 2's `--resolution lowest-direct`, which pip does not have
    new_venv "$WORK/build-venv" build uv || fail "a virtualenv with build and uv"
    UV=$WORK/build-venv/bin/uv
    timeout 300 "$WORK/build-venv/bin/python" -m build --outdir "$WORK/dist" "$WORK/source" >"$WORK/build.log" 2>&1 ||
        {
            tail -n 40 "$WORK/build.log" >&2
            fail "python -m build"
        }
    WHEEL=$(echo "$WORK"/dist/twinserve-*-py3-none-any.whl)
    SDIST=$(echo "$WORK"/dist/twinserve-*.tar.gz)
    if [ ! -f "$WHEEL" ] || [ ! -f "$SDIST" ]; then
        fail "python -m build made no wheel and sdist: $(ls "$WORK/dist")"
    fi
    "$PYTHON" "$ROOT/scripts/check_wheel.py" "$WHEEL" "$SDIST"
}

# -- 2. the base install --------------------------------------------------------------------------------------
base_install() {
    # --no-compile: each command compiles what it imports, once (pip's compiling all of scikit-learn and SciPy at
    # install was a CPU-bound half minute beside the suite's tests).
    new_venv "$WORK/base" --no-compile "$WHEEL" || fail "pip install the wheel (no extras)"
    TS=$WORK/base/bin/twinserve
    local version
    version=$(timeout 60 "$TS" --version)
    log "$version"
    [ "$version" = "twinserve $(basename "$WHEEL" | cut -d- -f2)" ] || fail "twinserve --version says $version"
    timeout 60 "$TS" --help >/dev/null
}

serve_each_arch() {
    local arch port
    for arch in sync async hybrid; do
        port=$(free_port)
        start_server "$WORK/serve-$arch.log" "$TS" serve --arch "$arch" --port "$port"
        wait_ready "$port" "$SERVER_PID" "$WORK/serve-$arch.log"
        predict_iris "$port"
        stop_server "$SERVER_PID" "$WORK/serve-$arch.log"
        log "serve --arch $arch: ok"
    done
}

bench_and_advise() {
    local out=$WORK/bench
    (cd "$WORK" && timeout 300 "$TS" bench --concurrency 2 --duration 2 --warmup 0.5 --arch sync,async,hybrid \
        --out "$out") >"$WORK/bench.log" 2>&1 || {
        tail -n 40 "$WORK/bench.log" >&2
        fail "twinserve bench"
    }
    if [ ! -s "$out/results.json" ] || [ ! -s "$out/report.html" ]; then
        fail "bench wrote no results.json/report.html"
    fi
    timeout 120 "$TS" advise "$out" >"$WORK/advise.log" 2>&1 || {
        cat "$WORK/advise.log" >&2
        fail "twinserve advise"
    }
    tail -n 5 "$WORK/advise.log"
}

other_base_commands() {
    timeout 60 "$TS" locustfile -o "$WORK/locustfile.py" >/dev/null
    "$WORK/base/bin/python" -m py_compile "$WORK/locustfile.py"
    timeout 60 "$TS" k8s --image x >"$WORK/k8s.yaml"
    grep -q '^kind: Deployment' "$WORK/k8s.yaml" || fail "twinserve k8s wrote no Deployment"
    k8s_out_is_buildable
}

# `twinserve k8s --out DIR` from the base install: DIR is the image's build context. Every file the Dockerfile
# COPYs must be there, and the twinserve wheel it installs must be the one built in stage 1 (the same files and
# metadata: so it installs with extras as that one does in stage 3), with the model file at its relative path.
k8s_out_is_buildable() {
    local ctx=$WORK/k8s-out model=$WORK/k8s-model
    mkdir -p "$model/models"
    printf 'class Echo:\n    def predict(self, batch: list[str]) -> list[str]:\n        return batch\n' \
        >"$model/models/echo.py"
    (cd "$model" && timeout 60 "$TS" k8s --image x --out "$ctx" --extra otel models/echo.py:Echo) >/dev/null
    "$PYTHON" - "$ctx" "$WHEEL" <<'EOF'
import json, pathlib, shlex, sys, zipfile
ctx, built = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
lines = (ctx / "Dockerfile").read_text().splitlines()
copies = [json.loads(line[5:]) if line[5:6] == "[" else shlex.split(line[5:]) for line in lines if line.startswith("COPY ")]
sources = [source for copy in copies for source in copy[:-1]]  # the last one is the destination in the image
assert sources == [built.name, "models/echo.py"], sources
for source in sources:
    assert (ctx / source).is_file(), f"the Dockerfile COPYs {source}, which is not in {ctx}"
assert f'RUN pip install "/tmp/wheels/{built.name}[otel]"' in "\n".join(lines), lines
def contents(path):
    with zipfile.ZipFile(path) as wheel:
        return {n: wheel.read(n) for n in wheel.namelist() if not n.endswith(("/RECORD", "/WHEEL"))}
packed, made = contents(ctx / built.name), contents(built)
assert packed.keys() == made.keys(), sorted(packed.keys() ^ made.keys())
differ = [name for name in made if packed[name] != made[name]]
assert not differ, f"k8s --out's wheel differs from the built one in {differ}"
print(f"k8s --out: COPYs {sources}; its wheel holds the built wheel's {len(made)} files")
EOF
}

# expect_extra_error EXTRA COMMAND...: exit 2 and exactly one stderr line that names the extra.
expect_extra_error() {
    local extra=$1 rc=0 err=$WORK/extra-error.err
    shift
    timeout 120 "$@" >/dev/null 2>"$err" </dev/null || rc=$?
    # twinserve.errors.MissingExtra: "<what> needs <the 'EXTRA' extra | what it brings>: pip install 'twinserve[EXTRA]'"
    local pattern="^twinserve: error: .+ needs .+: pip install 'twinserve\\[$extra\\]'\$"
    if [ "$rc" -ne 2 ] || [ "$(wc -l <"$err")" -ne 1 ] || ! grep -Eq "$pattern" "$err"; then
        head -n 20 "$err" >&2
        fail "'${*#"$WORK"/base/bin/}' in the base install: expected exit 2 and one line naming '$extra', got exit $rc"
    fi
    log "$(cat "$err")"
}

extra_errors() {
    if [ "$EXTRA_ERRORS" = 0 ]; then
        log "skipped (USER_PATH_EXTRA_ERRORS=0)"
        return
    fi
    expect_extra_error ray "$TS" ray twinserve.examples.tabular:Classifier --port "$(free_port)" --num-cpus 1
    OTEL_TRACES_EXPORTER=console expect_extra_error otel "$TS" serve --tracing --port "$(free_port)"
    expect_extra_error locust "$TS" bench --driver locust --concurrency 2 --duration 2 --arch async \
        --out "$WORK/bench-locust-base"
    expect_extra_error torch "$TS" serve twinserve.examples.embed:MiniLM --port "$(free_port)"
}

# contract_layer VENV: the in-process contract tests (tests/contract) run by VENV's python against the twinserve
# installed there (not the source tree: the repository root is on sys.path for `tests`, src/ is not).
contract_layer() {
    local venv=$1 out
    out=$(dirname "$venv")/contract-$(basename "$venv").log
    "$UV" pip install -q --python "$venv/bin/python" "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.6" "hypothesis>=6.100" \
        >"$out" 2>&1 || fail "pytest into $venv"
    # On both cores: the extras' virtualenvs meanwhile mostly wait on the network and the disk.
    (cd "$ROOT" && timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 tests/contract) \
        >>"$out" 2>&1 || {
        tail -n 40 "$out" >&2
        fail "the contract layer against $venv"
    }
    "$venv/bin/python" - "$ROOT" <<'PY' || fail "$venv imported twinserve from the source tree"
import pathlib, sys, twinserve
assert pathlib.Path(sys.argv[1]) / "src" not in pathlib.Path(twinserve.__file__).parents, twinserve.__file__
PY
    log "contract layer against $(basename "$venv"): $(tail -n 1 "$out")"
}

# The floors pyproject.toml declares, as a user whose environment pins them gets them: every direct dependency at
# its lowest allowed version (theirs at whatever those need).
lowest_install() {
    # The wheel's own requirements as the direct ones: installing the wheel alone would make them transitive, which
    # lowest-direct leaves at their newest.
    "$WORK/build-venv/bin/python" - "$WHEEL" >"$WORK/lowest.in" <<'PY'
import sys
from importlib.metadata import PathDistribution
from zipfile import Path as ZipPath
(info,) = [p for p in ZipPath(sys.argv[1]).iterdir() if p.name.endswith(".dist-info")]
print("\n".join(r for r in PathDistribution(info).requires or [] if "extra ==" not in r))
PY
    "$UV" venv -q --python "$PYTHON" "$WORK/lowest" >/dev/null
    timeout 900 "$UV" pip install -q --python "$WORK/lowest/bin/python" --resolution lowest-direct \
        -r "$WORK/lowest.in" "$WHEEL" >"$WORK/lowest.pip.log" 2>&1 || {
        tail -n 40 "$WORK/lowest.pip.log" >&2
        fail "uv pip install --resolution lowest-direct the wheel"
    }
    log "lowest: $("$UV" pip freeze --python "$WORK/lowest/bin/python" 2>/dev/null |
        grep -Ei '^(flask|gunicorn|starlette|uvicorn|pydantic|pydantic-settings|numpy|scikit-learn)==' | tr '\n' ' ')"
    TS=$WORK/lowest/bin/twinserve serve_each_arch
    contract_layer "$WORK/lowest"
    gunicorn_lines
}

# The sync architecture on every gunicorn release line the floor allows (issue #42: before 27.0 each of them
# crashed twinserve at import): the floor's line served above, the newest in the suite and stage 2's base install,
# the lines between them here, each in the lowest install with only gunicorn changed.
GUNICORN_LINES=${GUNICORN_LINES:-"24 25 26"}
gunicorn_lines() {
    local line port version
    for line in $GUNICORN_LINES; do
        "$UV" pip install -q --python "$WORK/lowest/bin/python" "gunicorn==$line.*" >>"$WORK/lowest.pip.log" 2>&1 ||
            fail "uv pip install gunicorn==$line.*"
        version=$("$WORK/lowest/bin/python" -c 'import gunicorn; print(gunicorn.__version__)')
        port=$(free_port)
        start_server "$WORK/serve-gunicorn-$line.log" "$WORK/lowest/bin/twinserve" serve --arch sync --port "$port"
        wait_ready "$port" "$SERVER_PID" "$WORK/serve-gunicorn-$line.log"
        predict_iris "$port"
        stop_server "$SERVER_PID" "$WORK/serve-gunicorn-$line.log"
        log "serve --arch sync on gunicorn $version: ok"
    done
}

# -- 3. each extra in its own virtualenv ----------------------------------------------------------------------
extra_torch() {
    local bin=$1 port out=$WORK/torch.log answer
    port=$(free_port)
    HF_HUB_OFFLINE=1 start_server "$out" "$bin/twinserve" serve twinserve.examples.embed:MiniLM --arch async \
        --port "$port"
    wait_ready "$port" "$SERVER_PID" "$out" 300
    answer=$(curl -s -f --max-time 60 "localhost:$port/v1/models/minilm:predict" -H 'content-type: application/json' \
        -d '{"instances": ["A model server answers prediction requests over HTTP."]}') || fail "MiniLM predict"
    "$bin/python" -c 'import json, sys; (e,) = json.loads(sys.argv[1])["predictions"]; assert len(e) == 384, len(e)' \
        "$answer" || fail "MiniLM answered ${answer:0:200}"
    stop_server "$SERVER_PID" "$out"
    log "MiniLM: one 384-dimensional embedding"
    k8s_replay_torch_repository "$bin"
}

extra_otel() {
    local bin=$1 port out=$WORK/otel.log
    port=$(free_port)
    OTEL_TRACES_EXPORTER=console OTEL_BSP_SCHEDULE_DELAY=100 start_server "$out" "$bin/twinserve" serve --tracing \
        --arch async --port "$port"
    wait_ready "$port" "$SERVER_PID" "$out"
    predict_iris "$port"
    stop_server "$SERVER_PID" "$out"  # shutdown flushes the spans still buffered
    grep -q '"trace_id"' "$out" || {
        tail -n 40 "$out" >&2
        fail "no span on the console exporter"
    }
    log "otel: $(grep -c '"trace_id"' "$out") span(s) on the console"
}

extra_locust() {
    local bin=$1
    (cd "$WORK" && timeout 300 "$bin/twinserve" bench --driver locust --concurrency 2 --duration 2 --warmup 0.5 \
        --arch async --out "$WORK/bench-locust") >"$WORK/locust.log" 2>&1 || {
        tail -n 40 "$WORK/locust.log" >&2
        fail "twinserve bench --driver locust"
    }
    [ -s "$WORK/bench-locust/results.json" ] || fail "bench --driver locust wrote no results.json"
}

extra_ray() {
    local bin=$1 port out=$WORK/ray.log ray_tmp=$WORK/ray descendants p left=()
    port=$(free_port)
    mkdir -p "$ray_tmp"
    TMPDIR=$ray_tmp start_server "$out" "$bin/twinserve" ray twinserve.examples.tabular:Classifier --port "$port" \
        --num-cpus 2
    wait_ready "$port" "$SERVER_PID" "$out" 300
    predict_iris "$port"
    descendants=$("$bin/python" -c 'import psutil, sys
print(" ".join(f"{p.pid}:{p.name()}" for p in psutil.Process(int(sys.argv[1])).children(recursive=True)))' \
        "$SERVER_PID")
    grep -q raylet <<<"$descendants" || fail "no raylet under twinserve ray: $descendants"
    stop_server "$SERVER_PID" "$out" 120
    for _ in $(seq 75); do
        left=()
        for p in $descendants; do kill -0 "${p%%:*}" 2>/dev/null && left+=("$p"); done
        [ ${#left[@]} -eq 0 ] && break
        sleep 0.2
    done
    [ ${#left[@]} -eq 0 ] || fail "Ray processes left running after SIGTERM: ${left[*]}"
    log "ray: stopped, no Ray process left ($(wc -w <<<"$descendants") were running)"
}

extra_safe() {
    local bin=$1 port out=$WORK/safe.log answer
    cat >"$WORK/safe_model.py" <<'EOF'
"""A scikit-learn model saved with skops and loaded back with twinserve.load_sklearn (the safe extra)."""

import tempfile
from pathlib import Path

import twinserve


class SafeIris(twinserve.Model):
    name = "safeiris"

    def load(self) -> None:
        import skops.io
        from sklearn.datasets import load_iris
        from sklearn.linear_model import LogisticRegression

        features, labels = load_iris(return_X_y=True)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "model.skops"
            skops.io.dump(LogisticRegression(max_iter=1000).fit(features, labels), path)
            self.clf = twinserve.load_sklearn(path)

    def predict(self, batch: list[list[float]]) -> list[int]:
        return [int(label) for label in self.clf.predict(batch)]
EOF
    port=$(free_port)
    start_server "$out" "$bin/twinserve" serve "$WORK/safe_model.py:SafeIris" --arch async --port "$port"
    wait_ready "$port" "$SERVER_PID" "$out"
    answer=$(curl -s -f --max-time 30 "localhost:$port/v1/models/safeiris:predict" \
        -H 'content-type: application/json' -d '{"instances": [[5.1, 3.5, 1.4, 0.2]]}') || fail "safe predict"
    log "predict: $answer"
    [ "$(tr -d ' ' <<<"$answer")" = '{"predictions":[0]}' ] || fail "the skops model answered $answer"
    stop_server "$SERVER_PID" "$out"
    k8s_replay_skops "$bin"
}

# k8s_replay BIN EXTRA PROJECT MODEL INSTANCES EXPECTED K8S-ARGS...: `twinserve k8s --out` run in PROJECT by BIN's
# twinserve (with no --extra: what the image needs must be found), then its Dockerfile replayed with BIN's virtualenv
# standing in for the image's Python. That virtualenv was made by `pip install WHEEL[EXTRA]` alone, which is the
# Dockerfile's pip step (k8s --out's wheel is stage 1's: stage 2 checks it), so the replay requires the step to ask
# for exactly EXTRA, runs it (pip finds it all there) and serves MODEL from the replayed WORKDIR.
k8s_replay() {
    local bin=$1 extra=$2 project=$3 model=$4 instances=$5 expected=$6
    shift 6
    (cd "$project" && timeout 60 "$bin/twinserve" k8s --image x --arch async --out out "$@") >"$project.k8s.log" \
        2>&1 || {
        cat "$project.k8s.log" >&2
        fail "twinserve k8s --out in $project"
    }
    grep -E '^(carried|skipped|extra)' "$project.k8s.log" | while IFS= read -r line; do log "k8s --out: $line"; done ||
        true
    timeout 600 "$PYTHON" "$ROOT/tests/live/deploy/test_k8s_replay.py" "$project/out" --venv "$(dirname "$bin")" \
        --made-with "$extra" --model "$model" --instances "$instances" --expect "$expected" >"$project.replay.log" \
        2>&1 || {
        tail -n 60 "$project.replay.log" >&2
        fail "replaying the Dockerfile of $project/out"
    }
    log "$(tail -n 1 "$project.replay.log")"
}

# Issue #43's model: its skops weights beside its module, loaded with twinserve.load_sklearn.
k8s_replay_skops() {
    local bin=$1 project=$WORK/k8s-skops
    mkdir -p "$project/models/iris"
    cat >"$project/models/iris/model.py" <<'EOF'
from pathlib import Path

import twinserve


class Iris(twinserve.Model):
    def load(self) -> None:
        self.clf = twinserve.load_sklearn(Path(__file__).with_name("bc.skops"))

    def predict(self, batch: list[list[float]]) -> list[int]:
        return [int(label) for label in self.clf.predict(batch)]
EOF
    "$bin/python" - "$project/models/iris/bc.skops" <<'EOF'
import sys

import skops.io
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

features, labels = load_iris(return_X_y=True)
skops.io.dump(LogisticRegression(max_iter=1000).fit(features, labels), sys.argv[1])
EOF
    k8s_replay "$bin" safe "$project" iris '[[5.1, 3.5, 1.4, 0.2]]' '[0]' models/iris/model.py:Iris
}

# A model repository holding a torch model whose weights (torch.save of a state dict) lie in its version folder.
k8s_replay_torch_repository() {
    local bin=$1 project=$WORK/k8s-torch
    mkdir -p "$project/repo/mlp/1"
    echo 'model = "model.py:Mlp"' >"$project/repo/mlp/twinserve.toml"
    cat >"$project/repo/mlp/1/model.py" <<'EOF'
from pathlib import Path

import torch

import twinserve


class Mlp(twinserve.Model):
    def load(self) -> None:
        self.net = torch.nn.Linear(4, 3)
        self.net.load_state_dict(twinserve.load_torch_weights(Path(__file__).with_name("weights.pt")))

    def predict(self, batch: list[list[float]]) -> list[int]:
        with torch.no_grad():
            return self.net(torch.tensor(batch)).argmax(dim=1).tolist()
EOF
    # Weights that pick the largest of the first three features: the answer is known without training.
    "$bin/python" -c 'import sys, torch
torch.save({"weight": torch.eye(3, 4), "bias": torch.zeros(3)}, sys.argv[1])' "$project/repo/mlp/1/weights.pt"
    k8s_replay "$bin" torch "$project" mlp '[[0, 1, 5, 0], [3, 1, 0, 0]]' '[2, 0]' --model-repository repo
}

# The extras' virtualenvs, made in the background: one pip at a time while stage 2 runs (it starts servers with
# deadlines on the same cores), two at a time once it is done (stage 3 then mostly waits on pip). Without
# compiling every module at install (--no-compile; torch and ray ship thousands): the one command run in each
# venv compiles what it imports. Each writes venv-EXTRA.done: "ok|failed SECONDS".
install_extra() {
    local extra=$1 t0=$EPOCHREALTIME status=ok
    new_venv "$WORK/venv-$extra" --no-compile "${WHEEL}[$extra]" || status=failed
    echo "$status $(elapsed "$t0")" >"$WORK/venv-$extra.done"
}

install_extras() {
    local extra lanes
    for extra in $EXTRAS; do
        while :; do
            lanes=1
            [ -f "$WORK/stage2.done" ] && lanes=2
            [ "$(jobs -rp | wc -l)" -lt "$lanes" ] && break
            sleep 1
        done
        install_extra "$extra" &
    done
    wait
}

# kill_tree PID: SIGTERM to PID and everything under it (the installer, its lanes, the pips under them).
kill_tree() {
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill -TERM "$1" 2>/dev/null || true
}

extra_venv() {
    local extra=$1 dir=$WORK/venv-$1 deadline=$((SECONDS + 1800)) status seconds t0=$EPOCHREALTIME
    until [ -f "$dir.done" ]; do
        kill -0 "$INSTALLER_PID" 2>/dev/null || [ -f "$dir.done" ] || fail "the extras' installer stopped early"
        [ "$SECONDS" -lt "$deadline" ] || fail "no virtualenv for $extra within 1800 s"
        sleep 1
    done
    read -r status seconds <"$dir.done"
    [ "$status" = ok ] || {
        tail -n 40 "$dir.pip.log" >&2
        fail "pip install '${WHEEL}[$extra]' into a fresh virtualenv"
    }
    log "virtualenv with [$extra]: pip took $seconds s (in the background), waited $(elapsed "$t0") s for it"
    TIMINGS+=("3   venv + pip install '[$extra]' (background)|$seconds")
    PYTHONDONTWRITEBYTECODE= "extra_$extra" "$dir/bin"  # compiled once here: the venv was made --no-compile
    rm -rf "$dir" # disk: torch and ray are large
}

# -- 4. the README's first command on a fresh clone -----------------------------------------------------------
readme_make_bench() {
    local clone=$WORK/clone results
    git clone -q "$ROOT" "$clone"
    git -C "$clone" checkout -q --detach "$(git -C "$ROOT" rev-parse HEAD)"
    (cd "$clone" && timeout 900 make bench CONCURRENCY=2 DURATION=2 WARMUP=0.5) >"$WORK/make-bench.log" 2>&1 || {
        tail -n 40 "$WORK/make-bench.log" >&2
        fail "make bench on a fresh clone"
    }
    results=$(ls -d "$clone"/twinserve-results/*/)
    [ "$(wc -l <<<"$results")" -eq 1 ] || fail "expected one twinserve-results/<timestamp>/, got: $results"
    if [ ! -s "${results}results.json" ] || [ ! -s "${results}report.html" ]; then
        fail "make bench wrote no results.json/report.html in $results"
    fi
    log "make bench wrote ${results#"$clone"/}{results.json,report.html}"
}

log "work folder $WORK, pip cache $PIP_CACHE_DIR, $("$PYTHON" --version)"
timed "1 build sdist + wheel, check contents" build
if [ -n "$EXTRAS" ]; then
    install_extras >"$WORK/install-extras.log" 2>&1 &
    INSTALLER_PID=$!
    BACKGROUND+=("$INSTALLER_PID")
fi
if [ "${USER_PATH_BASE:-1}" != 0 ]; then
    timed "2 base install (no extras)" base_install
    timed "2 serve sync/async/hybrid + curl predict" serve_each_arch
    timed "2 bench (3 archs, 1 level) + advise" bench_and_advise
    timed "2 locustfile, k8s (+ --out build context)" other_base_commands
    timed "2 commands needing an extra fail in one line" extra_errors
    # The newest end's contract layer is `make test`'s (its virtualenv resolves the newest versions too): run here
    # as well it cost a minute of a CI bounded at twenty.
    if [ "${USER_PATH_LOWEST:-1}" != 0 ]; then
        timed "2 lowest versions: serve, contract layer, gunicorn lines" lowest_install
    fi
fi
touch "$WORK/stage2.done"
# Stage 4 beside stage 3: by now stage 3 mostly waits on its commands' servers, and each stage has its deadlines.
if [ "${USER_PATH_CLONE:-1}" != 0 ]; then
    (
        t0=$EPOCHREALTIME
        readme_make_bench
        elapsed "$t0" >"$WORK/stage4.seconds"
    ) >"$WORK/stage4.log" 2>&1 &
    STAGE4_PID=$!
    BACKGROUND+=("$STAGE4_PID")
fi
# Stage 3 in two lanes: each extra's command mostly waits on a server starting (and stage 4 shares the cores), so
# two at a time take little more than one. A lane's output and timings are printed when it is waited for.
extra_lane() {
    local extra=$1 t0=$EPOCHREALTIME
    SERVERS=() TIMINGS=()
    trap 'for pid in "${SERVERS[@]}"; do kill_tree "$pid"; done' EXIT  # its own servers, if it fails
    log "-- 3 extra $extra"
    extra_venv "$extra"
    TIMINGS+=("3 extra $extra: wait for its venv + command|$(elapsed "$t0")")
    printf '%s\n' "${TIMINGS[@]}" >"$WORK/stage3-$extra.timings"
}
wait_lane() {
    local pid=${1%%:*} extra=${1#*:} rc=0 line
    wait "$pid" || rc=$?
    cat "$WORK/stage3-$extra.log"
    STAGE="3 extra $extra"
    [ "$rc" -eq 0 ] || fail "stage 3: the extra $extra (exit $rc)"
    while IFS= read -r line; do TIMINGS+=("$line"); done <"$WORK/stage3-$extra.timings"
}
LANES=()
for extra in $EXTRAS; do
    if [ ${#LANES[@]} -ge 2 ]; then
        wait_lane "${LANES[0]}"
        LANES=("${LANES[@]:1}")
    fi
    extra_lane "$extra" >"$WORK/stage3-$extra.log" 2>&1 &
    LANES+=("$!:$extra")
    BACKGROUND+=("$!")
done
for lane in "${LANES[@]}"; do wait_lane "$lane"; done
stage4_done() {
    local rc=0
    wait "$STAGE4_PID" || rc=$?
    cat "$WORK/stage4.log"
    [ "$rc" -eq 0 ] || fail "stage 4 (make bench on a fresh clone) failed"
    TIMINGS+=("4   its own time, beside stage 3|$(cat "$WORK/stage4.seconds")")
}
if [ "${USER_PATH_CLONE:-1}" != 0 ]; then
    timed "4 fresh clone: make bench (short), waited for" stage4_done
fi
