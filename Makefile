# Every script a person runs is a make target; CI (.ci/run) calls `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PTT := $(VENV)/bin/ptt
# Development pins (the package itself only asks for torch>=2.4); a CUDA build that also runs on CPU.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
EXTRAS := dev,data,infer,report,script,docs
# The exact set the suite was last green with (make lock writes it); CONSTRAINTS= installs the newest in range.
CONSTRAINTS ?= constraints.txt
PIP_C := $(if $(wildcard $(CONSTRAINTS)),-c $(CONSTRAINTS))
# Debian packages with real data: Fashion-MNIST and wallpaper photos (see ../shared/ANCHORS.md section 5).
APT_DATA := dataset-fashion-mnist lomiri-wallpapers-16.04 lomiri-wallpapers-20.04 mate-backgrounds plasma-workspace-wallpapers
# libjpeg62-turbo-dev + gcc: the region-of-interest JPEG decode compiles its small C shim against them at first use
APT_SYSTEM := chromium libturbojpeg0 libdnnl2 libjpeg62-turbo-dev gcc
PYTEST_ARGS ?=

.PHONY: lock pytest-avx2 bench-train bench-loop bench-checkpoint setup system-deps demo test lint format typecheck pytest bench bench-smoke docs docs-serve gpu-check clean help data bench-pack peers-env bench-data bench-tune screenshot bench-design bench-memory bench-memory-tune lint-examples bench-infer bench-int8-breakdown bench-int8-no-vnni bench-fp32-breakdown bench-fp32-conv-ceiling bench-artefact-reload bench-compression ffcv-env bench-data-hires bench-roi-decode bench-remote bench-detection-data bench-scale bench-memory-planner check-detection-reference bench-loader-shm detection-set ultralytics-env bench-ultralytics yolo-site pytest-ultralytics bench-convergence bench-convergence-optimize

help:
	@echo "make demo   - create .venv, install, run 'ptt tune' on the built-in workload"
	@echo "make test   - create .venv, install, lint, type-check and run the whole test suite"
	@echo "make bench  - run every trick's bench case at full size, results under bench-results/"
	@echo "make docs   - build the documentation site into site/ (strict, offline); make docs-serve to read it"

$(VENV)/.installed: pyproject.toml $(wildcard $(CONSTRAINTS))
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PINS) $(PIP_C)
	$(PIP) install -q -e ".[$(EXTRAS)]" $(TORCH_PINS) $(PIP_C)
	touch $@

# Record the installed set as the constraints file (run after a green `make test`; see CONTRIBUTING.md "Installs").
lock: setup
	{ echo "# The exact versions the suite was last green with: written by 'make lock', read by 'make setup'."; \
	  echo "# $$($(PY) -c 'import platform; print(platform.python_version(), platform.machine())')"; \
	  $(PIP) freeze --exclude-editable --disable-pip-version-check | grep -v -i '^pytorchtricks' | LC_ALL=C sort -f; \
	} > constraints.txt.tmp && mv constraints.txt.tmp constraints.txt

setup: $(VENV)/.installed

# Real data for tests and benchmarks comes from Debian packages; installs only what is missing.
system-deps:
	@missing=""; for p in $(APT_DATA) $(APT_SYSTEM); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "warning: missing Debian packages:$$missing (run as root: apt-get install$$missing); tests that need them skip" >&2; \
	  fi; \
	fi

# The demo runs in the user's default environment (OpenMP's default wait policy): OMP_WAIT_POLICY=PASSIVE made the
# decoding workers of the baseline faster and the training step itself ~1.4x slower here (ResNet-18, 2 cores), so
# it would measure another job than the user's. On a machine loaded by other processes the diagnosis says so and
# suggests it; the receipt records the policy either way.
demo: setup system-deps
	$(PTT) tune --out tune-out

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks docsgen
	$(VENV)/bin/ruff format --check src tests benchmarks docsgen

format: setup
	$(VENV)/bin/ruff format src tests benchmarks docsgen
	$(VENV)/bin/ruff check --fix src tests benchmarks docsgen

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup system-deps
	$(PY) -m pytest $(PYTEST_ARGS)

# The CPU-sensitive tests (marker `isa`: precision, int8, oneDNN plan, memory estimate, tune's candidate rules) again
# with the kernels limited to AVX2, so a better CPU also proves what an AVX2-only one does (CONTRIBUTING.md says which
# library honours which switch). On an AVX2-only CPU it repeats the same decisions: cheap, and keeps CI one script.
ISA_AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
pytest-avx2: setup system-deps
	$(ISA_AVX2) $(PY) -m pytest -m isa -p no:cacheprovider $(PYTEST_ARGS)

# The Ultralytics integration's tests (tests/test_ultralytics.py) with Ultralytics installed outside the main venv
# (AGPL-3.0: never in our install): .yolo-site, on PYTHONPATH for this run only; the main run skips them, saying why.
YOLO_SITE := .yolo-site
YOLO_SITE_PKGS := ultralytics==8.4.190 ultralytics-thop polars nvidia-ml-py
yolo-site: setup
	test -d $(YOLO_SITE)/ultralytics || $(PIP) install -q --target $(YOLO_SITE) --no-deps $(YOLO_SITE_PKGS)
pytest-ultralytics: setup system-deps yolo-site
	YOLO_OFFLINE=1 PYTHONPATH=$(YOLO_SITE) $(PY) -m pytest tests/test_ultralytics.py -p no:cacheprovider $(PYTEST_ARGS)

test: setup system-deps lint typecheck docs pytest pytest-avx2 pytest-ultralytics

bench: setup
	$(PTT) bench --all --size full --out bench-results

bench-smoke: setup
	$(PTT) bench --all --size smoke --out bench-results

# On a machine with a CUDA GPU: the GPU tests and every bench case on CUDA; logs and JSONL go to $$OUT if set.
gpu-check: setup
	out=$${OUT:-bench-results}; mkdir -p $$out; \
	$(PY) -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee $$out/gpu-pytest.log; \
	$(PTT) bench --all --size full --device cuda --out $$out 2>&1 | tee $$out/gpu-bench.log

# The documentation site (mkdocs.yml; docsgen/ generates the catalogue, CLI, API and results pages from the code
# and results/ at build time) -> site/. Strict: a warning, a broken link or anchor, a docstring mkdocstrings cannot
# render fails the build. Offline: no web fonts, no CDN, no plugin that fetches. CI builds it as part of `make test`.
# NO_MKDOCS_2_WARNING: silences Material's banner about MkDocs 2 (pinned: mkdocs 1.6, Material 9).
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs
docs: setup
	$(MKDOCS) build --strict --clean --site-dir site

# Serve the site at http://127.0.0.1:8000, rebuilt on every save.
docs-serve: setup
	$(MKDOCS) serve --dev-addr 127.0.0.1:8000

# ---- targets added by the data, loop, model, analysis and tune work go below this line ----

# Benchmarks file their results by CPU class (avx2, avx512, avx512_bf16, amx: pytorchtricks.hardware), after the ISA
# limits in force: `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 make bench-infer` files under results/avx2/.
CPU_CLASS = $(shell $(PY) -c "from pytorchtricks.hardware import cpu_caps; print(cpu_caps().cpu_class)")
RESULTS ?= results/$(CPU_CLASS)

# 10,000 distinct real-photo JPEGs (wallpaper crops, fixed seed) in data/photos/<class>/ for tests and benchmarks.
data: setup system-deps
	$(PY) -m pytorchtricks.data.photoset data/photos --count 10000

# A learnable detection set: Fashion-MNIST items pasted on wallpaper crops (10 classes, COCO + YOLO layouts,
# train/val, fixed seed, parameters in its ptt-set.json) in data/detection-set/. Other parameters, e.g.
# `make detection-set DETECTION_SET_ARGS="--train 2000 --long-side native" DETECTION_SET=data/detection-set-hires`.
DETECTION_SET ?= data/detection-set
DETECTION_SET_ARGS ?=
detection-set: setup system-deps
	$(PY) -m pytorchtricks.data.detection_set $(DETECTION_SET) $(DETECTION_SET_ARGS)

# Pack throughput / storage overhead per format, random reads, decode img/s per backend -> $(RESULTS)/.
bench-pack: setup data
	flock /tmp/ptt-bench.lock $(PY) benchmarks/pack_and_decode.py --photos data/photos --n 5000 --out $(RESULTS)

# Peer loaders for the data benchmark, in their own environment (never in the core install). It reuses the core
# venv's packages (torch, torchvision, pytorchtricks) through a .pth file, so a peer's pins shadow, never replace.
PEERS_VENV := .venv-peers
PEERS_PKGS := webdataset==1.0.2 litdata==0.2.76 nvidia-dali-cuda130==2.4.0 pycocotools==2.0.11
peers-env: setup
	test -x $(PEERS_VENV)/bin/python || python3 -m venv $(PEERS_VENV)
	site=$$($(PEERS_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	core=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	printf '%s\n%s\n' "$$core" "$(CURDIR)/src" > $$site/_ptt_core.pth
	$(PEERS_VENV)/bin/pip install -q $(PEERS_PKGS)

# FFCV in a third environment: its C extension builds from the sdist against Debian's OpenCV and libjpeg-turbo
# headers (installed through system-deps, as root), and it brings numba and opencv-python, so it gets its own torch
# (the core pins) and sees pytorchtricks (the benchmark's clock) through a .pth file to src/, written after the
# install; rich is pytorchtricks' one dependency not already there.
FFCV_VENV := .venv-ffcv
FFCV_PKGS := ffcv==1.0.2 numba==0.68.1 numpy==2.4.6 rich
APT_FFCV := pkg-config libopencv-dev libturbojpeg0-dev
ffcv-env:
	$(MAKE) --no-print-directory system-deps APT_DATA= APT_SYSTEM="$(APT_FFCV)"
	test -x $(FFCV_VENV)/bin/python || python3 -m venv $(FFCV_VENV)
	$(FFCV_VENV)/bin/pip install -q $(TORCH_PINS) $(FFCV_PKGS)
	site=$$($(FFCV_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	printf '%s\n' "$(CURDIR)/src" > $$site/_ptt_src.pth

# Every loader on the same photos: RandomResizedCrop 224 + flip -> uint8 batches of 256, 2 workers, 2 epochs.
# IMAGES=2000 for a quick run; the committed results say which size they come from.
IMAGES ?= 10000
DATA_ROUNDS ?= 2
bench-data: setup data peers-env ffcv-env
	flock /tmp/ptt-bench.lock $(PY) benchmarks/data_loading.py --images $(IMAGES) --rounds $(DATA_ROUNDS) --out $(RESULTS)
	$(MAKE) --no-print-directory bench-data-hires

# The high-resolution set (>= 2 MP photos at native resolution, built once under /tmp/ptt-bench-data): ImageFolder,
# make_loader with and without the region-of-interest decode, DALI CPU's ROI decoder and FFCV; batch 64, 2 workers.
HIRES_IMAGES ?= 400
HIRES_ROUNDS ?= 3
HIRES_SYSTEMS ?= imagefolder,ptt-files-nowindow,ptt-files,dali-cpu,ffcv
bench-data-hires: setup system-deps peers-env ffcv-env
	flock /tmp/ptt-bench.lock $(PY) benchmarks/data_loading.py --set hires --images $(HIRES_IMAGES) --batch 64 \
	  --rounds $(HIRES_ROUNDS) --systems $(HIRES_SYSTEMS) --out $(RESULTS)

# Detection input on the >= 2 MP photos with seeded boxes (a COCO JSON): torchvision's reference (hflip policy; with
# RandomShortestSize; LSJ), make_detection_loader, DALI CPU and the decode floor, interleaved -> $(RESULTS)/detection_data-*.
DET_IMAGES ?= 120
DET_ROUNDS ?= 3
bench-detection-data: setup system-deps peers-env
	flock /tmp/ptt-bench.lock $(PY) benchmarks/detection_data.py --images $(DET_IMAGES) --rounds $(DET_ROUNDS) --out $(RESULTS)

# What holding batches in flight costs: reused /dev/shm slots at prefetch 2 and 1 (a small /dev/shm's plan), anonymous
# memory files (its fallback), a fresh buffer per batch, torchvision's DataLoader; alone and beside a device step,
# interleaved -> $(RESULTS)/loader_shm.*
bench-loader-shm: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/loader_shm.py --out $(RESULTS)

# Time to accuracy (issue 48): FCOS from scratch on the learnable detection set (built under /tmp) through torchvision's
# reference pipeline, make_detection_loader, + cache_in_ram, + channels_last/bf16; 3 seeds each, COCOeval mAP at a few
# checkpoints -> $(RESULTS)/convergence/ (markdown + jsonl + svg). ~40 min on 2 cores. E.g. CONV_ARGS="--steps 100".
CONV_ARGS ?=
bench-convergence: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/convergence.py --out $(RESULTS)/convergence $(CONV_ARGS)

# ptt optimize's picker on the detectors bench-convergence trained: each artefact's COCO mAP vs eager fp32
# (accuracy only: a shared lock) -> $(RESULTS)/convergence/optimize.md; AOTInductor int8 (minutes of compile) on the
# first model alone -> optimize-aoti-int8.md
CONV_MODELS ?= /tmp/ptt-bench-convergence/models/ptt-seed0.pt /tmp/ptt-bench-convergence/models/ptt-seed1.pt
bench-convergence-optimize: setup system-deps
	flock -s /tmp/ptt-bench.lock $(PY) benchmarks/_convergence_optimize.py --weights $(CONV_MODELS) --out $(RESULTS)/convergence
	flock -s /tmp/ptt-bench.lock $(PY) benchmarks/_convergence_optimize.py --weights $(firstword $(CONV_MODELS)) --engines aoti --precision int8 --no-unrolled --stem optimize-aoti-int8 --out $(RESULTS)/convergence

# ptt doctor run --tune on torchvision's detection reference, unmodified (not vendored: REFS=a checkout of
# pytorch/vision's references/detection) over the built-in photos with boxes -> $(RESULTS)/doctor-reference/.
check-detection-reference: setup system-deps
	@test -n "$(REFS)" || { echo "give REFS=path/to/vision/references/detection"; exit 2; }
	flock /tmp/ptt-bench.lock $(PY) benchmarks/detection_reference.py --references $(REFS) --out $(RESULTS)/doctor-reference

# Decode only, one thread: the crop's window vs the whole image at the same DCT scale -> $(RESULTS)/roi_decode-*.
bench-roi-decode: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/roi_decode.py --n 200 --rounds 5 --out $(RESULTS)

# `ptt tune` on a model with planted problems (conv bias before BN, fp32 on a bf16 CPU, input-bound loader), twice:
# both recommendations and the verify run (combined vs each single trick) -> $(RESULTS)/tune-planted.{jsonl,md}.
bench-tune: setup
	OMP_WAIT_POLICY=PASSIVE flock /tmp/ptt-bench.lock $(PY) benchmarks/tune_planted.py --out $(RESULTS)

# ShuffleNetV2 G1-G4 micro-benchmarks: equal-FLOPs variants, MAC ratio vs measured time ratio -> $(RESULTS)/design_rules.*
# (1 intra-op thread: stable on a shared 2-core machine; CUDA too when present).
bench-design: setup
	flock /tmp/ptt-bench.lock $(PY) benchmarks/design_rules.py --size full --rounds 7 --threads 1 --out $(RESULTS)

# estimate_memory vs the measured CPU peak for 4 models x 2 optimizers, and find_batch_size -> $(RESULTS)/memory_estimate.*
bench-memory: setup
	flock /tmp/ptt-bench.lock $(PY) benchmarks/memory_estimate.py --out $(RESULTS)

# checkpoint_activations_(model, budget=share) vs uniform per-block checkpointing vs torch.compile's
# activation_memory_budget at 70/50/30% of the activation peak: ResNet-18/50, ViT-B/16, ResNet-18-FPN, CPU training
# step -> $(RESULTS)/memory_planner.{jsonl,md}
bench-memory-planner: setup
	flock /tmp/ptt-bench.lock $(PY) benchmarks/memory_planner.py --out $(RESULTS)

# `ptt tune --memory-budget` on ResNet-18, 128 px, batch 64, training, the budget half the baseline's measured step
# peak: every configuration's predicted and measured peak and speed (the frontier) -> $(RESULTS)/memory-tune.jsonl,
# the report's frontier -> docs/memory-frontier.png (headless Chromium).
MEMORY_TUNE_OUT ?= memory-tune-out
bench-memory-tune: setup system-deps
	flock /tmp/ptt-bench.lock $(PTT) tune --model torchvision:resnet18 --data synthetic --batch-size 64 --input-size 128 \
	  --memory-budget 50% --time-budget 300 --out $(MEMORY_TUNE_OUT)
	mkdir -p $(RESULTS) && cp $(MEMORY_TUNE_OUT)/results.jsonl $(RESULTS)/memory-tune.jsonl
	profile=$$(mktemp -d); \
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
	  --disable-component-update --disable-sync --user-data-dir=$$profile --hide-scrollbars --window-size=1100,1500 \
	  --screenshot=$(CURDIR)/docs/memory-frontier.png file://$(abspath $(MEMORY_TUNE_OUT))/report.html; \
	rm -rf $$profile

# Example `ptt lint` outputs of three torchvision models (random weights) -> results/lint-*.txt.
lint-examples: setup
	for m in resnet50 mobilenet_v3_small shufflenet_v2_x1_0; do \
	  $(PTT) lint torchvision:$$m --input-shape 1,3,224,224 > results/lint-$$m.txt; done

# Render $(TUNE_OUT)/report.html in headless Chromium; the PNG under docs/ is what the tune guide shows.
TUNE_OUT ?= tune-out
screenshot: setup system-deps
	test -f $(TUNE_OUT)/report.html || $(MAKE) demo
	mkdir -p docs
	profile=$$(mktemp -d); \
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
	  --disable-component-update --disable-sync --user-data-dir=$$profile --hide-scrollbars --window-size=1100,3400 \
	  --screenshot=$(CURDIR)/docs/tune-report.png file://$(abspath $(TUNE_OUT))/report.html; \
	rm -rf $$profile

# Training step on CPU, ResNet-18 128px and ViT-tiny batch 64: naive fp32 vs each trick vs the best combination
# (interleaved rounds, peak memory) -> $(RESULTS)/train_step-cpu.{jsonl,md}. ROUNDS=3 keeps it near 30 min on 2 cores.
ROUNDS ?= 3
bench-train: setup
	flock /tmp/ptt-bench.lock $(PY) benchmarks/train_step.py --rounds $(ROUNDS) --out $(RESULTS)

# Full-size bench cases of the loop tricks (time AND peak memory; flatten_parameters vs foreach/fused peers)
# -> $(RESULTS)/loop/bench-full-cpu.jsonl + .md.
LOOP_TRICKS := mixed_precision accumulate_gradients checkpoint_activations to_inplace_abn fast_optimizer flatten_parameters
bench-loop: setup
	rm -f $(RESULTS)/loop/bench-full-cpu.jsonl
	flock /tmp/ptt-bench.lock $(PTT) bench $(LOOP_TRICKS) --size full --out $(RESULTS)/loop
	$(PTT) report $(RESULTS)/loop/bench-full-cpu.jsonl --format md > $(RESULTS)/loop/bench-full-cpu.md

# Checkpoint planner vs brute force over every uniform segmentation (exact step peak memory, 64-block residual MLP)
# -> $(RESULTS)/checkpoint_planner-cpu.{jsonl,md}.
bench-checkpoint: setup
	flock /tmp/ptt-bench.lock $(PY) benchmarks/checkpoint_planner.py --out $(RESULTS)

# The file `ptt optimize --precision any` hands back, timed in a fresh process (torch + pytorchtricks only) next to
# eager fp32 and to the receipt's own speed-up -> $(RESULTS)/artefact_reload.{jsonl,md}
bench-artefact-reload: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/artefact_reload.py --out $(RESULTS)/artefact_reload

# Could a oneDNN fp32 plan beat ONNX Runtime? ResNet-18's convs alone as oneDNN fp32 primitives (prepacked, fused ReLU)
# vs ORT's whole fp32 model, interleaved -> $(RESULTS)/fp32_conv_ceiling.{jsonl,md}
bench-fp32-conv-ceiling: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/fp32_conv_ceiling.py --out $(RESULTS)/fp32_conv_ceiling

# CPU inference of ResNet-18 at 160 px: eager, channels_last, fused, compile, bf16, int8 (ptt optimize --int8),
# ONNX Runtime fp32/int8, pruned, RepVGG train vs deploy -> $(RESULTS)/inference_cpu.{jsonl,md}. INFER_ROUNDS=3 for a quick run.
INFER_ROUNDS ?= 5
bench-infer: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/inference_cpu.py --rounds $(INFER_ROUNDS) --out $(RESULTS)/inference_cpu

# Why int8 trails ONNX Runtime at batch 1: one compiled int8 ResNet-18 call split into oneDNN kernel time, op
# set-up, guard check and the rest of the compiled graph, next to ORT static int8 -> $(RESULTS)/int8_breakdown.*
bench-int8-breakdown: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/int8_breakdown.py --threads 1 2 --out $(RESULTS)/int8_breakdown

# Where fp32 inference time goes, PyTorch eager (NCHW, channels_last) vs ONNX Runtime, per op kind, 1 thread
# -> $(RESULTS)/fp32_breakdown.*
bench-fp32-breakdown: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/fp32_breakdown.py --out $(RESULTS)/fp32_breakdown

# int8 without VNNI: SQNR through oneDNN's AVX2 kernels for 8-bit (saturating), 7-bit activations and 7-bit weights
# -> $(RESULTS)/int8_no_vnni.* (accuracy only, no timing)
bench-int8-no-vnni: setup system-deps
	$(PY) benchmarks/int8_no_vnni.py --out $(RESULTS)/int8_no_vnni

# Fashion-MNIST accuracy after int8 PTQ, DoReFa W4A4 QAT and 50% channel pruning -> $(RESULTS)/compression_accuracy.*
# (accuracy only, no timing). SUBSET=0 trains on all 60,000 images.
SUBSET ?= 20000
bench-compression: setup system-deps
	$(PY) benchmarks/compression_accuracy.py --train-subset $(SUBSET) --out $(RESULTS)/compression_accuracy

# Reading a pack from a local S3 server (moto on 127.0.0.1) vs the same pack on local disk vs LitData's
# StreamingDataset from the same server: images/s per epoch, bytes downloaded per node and the cache hit rate
# -> $(RESULTS)/remote_read-$(REMOTE_IMAGES).{jsonl,md}. Loopback is not a network: the bytes are what transfer.
REMOTE_IMAGES ?= 2000
bench-remote: setup data peers-env
	flock /tmp/ptt-bench.lock $(PY) benchmarks/remote_read.py --images $(REMOTE_IMAGES) --out $(RESULTS)

# Ten million images (issue 34): every per-sample stage (listing, pack, open, loader epoch and main-process USS,
# cache_in_ram build and reopen, inspect) at SCALE_SIZES tiny JPEGs built once under /tmp/ptt-scale, its slope and
# the 10M projection, plus `ptt pack --distributed` at 1, 2 and 4 ranks -> $(RESULTS)/scale-<sizes>.{jsonl,md}.
# The acceptance run adds 1000000 (about 10 GB of files and an hour on 2 cores).
SCALE_SIZES ?= 20000 100000
bench-scale: setup
	flock /tmp/ptt-bench.lock $(PY) benchmarks/scale.py --sizes $(SCALE_SIZES) --out $(RESULTS)

# Ultralytics YOLO in a fourth environment (AGPL code never in our install): the core torch pins, Ultralytics without
# its opencv-python (the headless build instead: no GUI libraries), our data extra's decoders, and our src/ through a
# .pth file written after the install.
ULTRALYTICS_VENV := .venv-ultralytics
ULTRALYTICS_PKGS := ultralytics==8.4.190
ULTRALYTICS_DEPS := numpy pillow matplotlib pyyaml requests scipy polars ultralytics-thop opencv-python-headless \
  simplejpeg pyturbojpeg isal lmdb rich psutil
ultralytics-env:
	test -x $(ULTRALYTICS_VENV)/bin/python || python3 -m venv $(ULTRALYTICS_VENV)
	$(ULTRALYTICS_VENV)/bin/pip install -q $(TORCH_PINS) $(ULTRALYTICS_DEPS) $(PIP_C)
	$(ULTRALYTICS_VENV)/bin/pip install -q --no-deps $(ULTRALYTICS_PKGS)
	site=$$($(ULTRALYTICS_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	printf '%s\n' "$(CURDIR)/src" > $$site/_ptt_src.pth

# Stock Ultralytics YOLO vs with ptt.ultralytics.accelerate (from the original files and from a pack written for
# imgsz) on the 2-24 MP wallpaper photos: the load stage, the whole data pipeline (mosaic on), time to the first batch
# at 100K images (linked, not copied, under /tmp), the CPU epoch, the epoch beside a declared accelerator step, and
# cache='ram' USS under torchrun with 2 ranks -> $(RESULTS)/ultralytics/. Sets are built first (outside the lock);
# each part is one timed run under the lock (ULTRA_PARTS picks some), its rows appended to the part's JSONL.
ULTRA_PARTS ?= load pipeline first-batch epoch ram
ULTRA_ROUNDS ?= 3
ULTRA_ARGS ?=
ULTRA_BENCH := $(ULTRALYTICS_VENV)/bin/python benchmarks/ultralytics_bench.py --rounds $(ULTRA_ROUNDS) \
  --out $(RESULTS)/ultralytics $(ULTRA_ARGS)
bench-ultralytics: setup system-deps ultralytics-env
	$(ULTRA_BENCH) --prepare $(ULTRA_PARTS)
	for part in $(ULTRA_PARTS); do flock /tmp/ptt-bench.lock $(ULTRA_BENCH) --part $$part; done
	$(ULTRA_BENCH) --report

clean:
	rm -rf bench-results .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info

# `make demo` as a new user runs it, twice on the machine as it is and once beside a CPU burner on one core (another
# program): the receipts under $(RESULTS)/demo-*/ and $(RESULTS)/demo.md (issue 29: a busy run says so).
.PHONY: bench-demo-receipts
bench-demo-receipts: setup system-deps
	flock /tmp/ptt-bench.lock $(PY) benchmarks/demo_receipts.py --out $(RESULTS)
