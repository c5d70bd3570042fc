# The two commands: `make demo` runs the main job, `make test` runs every test.
# Both install missing Debian packages first (scripts/install-deps.sh).
# `make install` installs the library, its headers, kvcache.pc, the CMake package and the
# kvcache command under $(PREFIX), staged under $(DESTDIR) if set.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_Q    := cmake --log-level=WARNING
PREFIX     ?= /usr/local
DESTDIR    ?=

.PHONY: all deps build build-asan test test-fast demo bench install uninstall format clean

all: build

deps:
	@scripts/install-deps.sh

# Optimised build (gcc).
build: deps
	@$(CMAKE_Q) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	@cmake --build $(BUILD) -j$(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer build (clang), with the fuzz targets.
build-asan: deps
	@CC=clang $(CMAKE_Q) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DKVC_SANITIZE=ON -DKVC_FUZZ=ON -DKVC_BENCH=OFF
	@cmake --build $(ASAN_BUILD) -j$(JOBS)

# Every test, twice: the optimised build, then the sanitizer build (with the fuzz runs).
test: build build-asan
	@echo "== tests: optimised build =="
	@ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
	@echo "== tests: ASan + UBSan build, fuzz targets included =="
	@ctest --test-dir $(ASAN_BUILD) --output-on-failure -j$(JOBS)

# The optimised build's tests only (quick loop while developing).
test-fast: build
	@ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# A short tour: one request's path through the prefix cache, a deployment that
# does not start and why, a scheduling question answered by the simulator, and what a
# real model file holds.
demo: build
	@echo "== kvcache explain: prompts through a 12-block prefix cache =="
	@./$(BUILD)/kvcache explain --seed 7 --pool-blocks 12 --block-size 4 examples/prompts.txt
	@echo "== kvcache plan: Llama-3.1-70B in bf16 on two H100s (TP 2) =="
	@./$(BUILD)/kvcache plan --model llama-3.1-70b --gpu h100-sxm --tp 2 | sed -n '/^3\. Does it start/,/^4\./p' | head -n -1 || true
	@echo "== kvcache sim: what does prefix caching save on multi-turn chat? =="
	@./$(BUILD)/kvcache sim --scenario examples/scenarios/multiturn.json
	@echo "== kvcache model info: a real model file (stories260K, llama2.c's tiny story model) =="
	@./$(BUILD)/kvcache model info tests/data/models/stories260K.gguf
	@echo "== kvcache run: the engine on stories260K, greedy from BOS: its story =="
	@./$(BUILD)/kvcache run --model tests/data/models/stories260K.gguf --prompt-ids 1 -n 120
	@echo "== kvcache run: four requests sharing a 40-token prompt, run together =="
	@./$(BUILD)/kvcache run --model tests/data/models/stories260K.gguf --prompts examples/story_prompts.txt -n 40
	@echo "== kvcache serve: a two-turn chat with curl; turn two finds turn one in the prefix cache =="
	@./$(BUILD)/kvcache serve --model tests/data/models/stories260K.gguf --chat-template llama3 --port 0 \
	    --threads 1 2>$(BUILD)/serve-demo.log & pid=$$!; port=; \
	  for i in $$(seq 100); do port=$$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' $(BUILD)/serve-demo.log); \
	    [ -n "$$port" ] && break; sleep 0.1; done; \
	  u=http://127.0.0.1:$$port/v1/chat/completions; \
	  m='{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me a story about a dog."}'; \
	  show='import json,sys; d=json.load(sys.stdin); u=d["usage"]; print("prompt_tokens %d, cached_tokens %d: %s" % (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], d["choices"][0]["message"]["content"]))'; \
	  r1=$$(curl -s $$u -d "{\"model\": \"stories260K\", \"max_tokens\": 32, \"temperature\": 0, \"messages\": [$$m]}"); \
	  printf 'turn 1: '; echo "$$r1" | python3 -c "$$show"; \
	  echo "$$r1" | python3 -c 'import json,sys; r=json.load(sys.stdin); m=json.loads("["+sys.argv[1]+"]"); m+=[r["choices"][0]["message"], {"role": "user", "content": "What did the dog do next?"}]; print(json.dumps({"model": "stories260K", "max_tokens": 24, "temperature": 0, "messages": m}))' "$$m" >$(BUILD)/serve-demo.turn2; \
	  printf 'turn 2: '; curl -s $$u -d @$(BUILD)/serve-demo.turn2 | python3 -c "$$show"; \
	  kill -TERM $$pid; wait $$pid

bench: build
	@for b in $(BUILD)/bench_*; do echo "== $$b"; $$b; done

# The engine against llama.cpp, side by side (bench/engine/README.md); about 25 minutes.
# BENCH_ARGS=--quick for a smoke check.  Installs the comparator (npm ci) in bench/llamacpp.
.PHONY: bench-engine
bench-engine: build
	@python3 bench/engine/run.py --no-build --build-dir $(BUILD) $(BENCH_ARGS)

# Install the optimised build: make install PREFIX=$$HOME/.local, or
# make install DESTDIR=/tmp/stage PREFIX=/usr (a package's staging tree).
install: build
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

# Remove what the last `make install` from $(BUILD) installed (its manifest lists the files).
uninstall:
	@test -f $(BUILD)/install_manifest.txt || { echo "uninstall: no $(BUILD)/install_manifest.txt"; exit 1; }
	@while IFS= read -r f || [ -n "$$f" ]; do rm -fv -- "$(DESTDIR)$$f"; done < $(BUILD)/install_manifest.txt

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
