# Redpilot — build, test ground and tests.
#
#   make run     bring up the dev cluster if no cluster is configured, run the operator
#   make test    everything: fmt, clippy, unit tests, tools, cluster, integration suites
#   make bench   scale measurements on the dev cluster (not part of make test)
#   make chaos   seeded schedules of operations and faults (SEED, RUNS, SEEDS, DURATION, ONLY)
#   make test-long  the long runs left out of make test, and every chaos seed that found a defect
#
# Tool binaries are built once per pinned version into ~/.cache/redpilot (or
# $REDPILOT_CACHE) and linked into bin/.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
# Builds are cached outside the clone, as .ci/run does; the local node maps
# the operator's image to the binary in this directory, so every target (and
# a dev cluster brought up by one) agrees on it.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/redpilot/cargo-target
# The linker (hack/cc-link, see .cargo/config.toml) at one path for every
# clone: cargo keeps the linker's path in each crate's fingerprint, so the
# config's clone-relative path made every new clone rebuild every crate in
# the shared target directory (a clean clone's `make test` compiled all the
# dependencies again in each profile).
CC_LINK := $(HOME)/.cache/redpilot/bin/cc-link
$(shell mkdir -p $(dir $(CC_LINK)) && (cmp -s hack/cc-link $(CC_LINK) || cp hack/cc-link $(CC_LINK)))
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER := $(CC_LINK)
KUBECONFIG_DEV := $(CURDIR)/.dev/kubeconfig
# Integration suites talk to the dev cluster unless KUBECONFIG names another.
export REDPILOT_KUBECONFIG ?= $(KUBECONFIG_DEV)

TOOL_GROUPS_CLUSTER := kube etcd kwok
# OLM packaging: bundle validation and scorecard, catalogs, OLM itself.
TOOL_GROUPS_OLM := operator-sdk opm olm
# Backups: an S3 server.
TOOL_GROUPS_BACKUP := versitygw
# Insights: Prometheus and promtool, Jaeger, the prometheus-operator CRDs.
TOOL_GROUPS_INSIGHTS := prometheus jaeger prometheus-crds
# Security: the cert-manager CRDs (spec.tls.issuerRef).
TOOL_GROUPS_SECURITY := cert-manager-crds
# Distribution: Helm (the chart suite).
TOOL_GROUPS_DIST := helm image grpcprobe
TOOL_GROUPS_ALL := $(TOOL_GROUPS_CLUSTER) $(TOOL_GROUPS_OLM) $(TOOL_GROUPS_BACKUP) $(TOOL_GROUPS_INSIGHTS) $(TOOL_GROUPS_SECURITY) $(TOOL_GROUPS_DIST)

.PHONY: bundle catalog olm-validate
.PHONY: all build setup prune fmt fmt-check clippy lint unit tools tools-cluster engines \
	cluster-up cluster-down chaos test-long release-bins registry registry-down bundle-image catalog-image test integration bench bench-failover bench-follow bench-pitr bench-autopilot bench-cluster bench-reshard bench-timing bench-upgrade bench-backup bench-restore bench-tls bench-tuning bench-idle hot-symbols run run-stop version plugin install-yaml helm-chart image clean help

all: build

help:
	@sed -n '1,10p' Makefile

build:
	$(CARGO) build --workspace --all-targets

# The Debian and PyPI packages the test ground needs, installed when missing
# (hack/setup.sh, shared with .ci/run). Needs root when something is missing.
setup:
	@bash hack/setup.sh

# Stale builds of this crate out of Cargo's shared target directory, and a
# clear error when the disk has too little room for a test run.
prune:
	@bash hack/prune-target.sh

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

lint: fmt-check clippy

# Unit tests: the library and binaries, no cluster and no Redis needed.
unit:
	$(CARGO) test --workspace --lib --bins

# One target per tool group, so a suite pays only for what it uses.
tools-%:
	bash tools/build.sh $*

tools-cluster: $(addprefix tools-,$(TOOL_GROUPS_CLUSTER))

tools: $(addprefix tools-,$(TOOL_GROUPS_ALL))

engines:
	bash dev/engines.sh

# Earlier releases' operators, built from the commits catalog/releases.txt
# names (cached outside the clone), for the OLM upgrade test.
RELEASES_BUILT := 0.1.0
release-bins:
	@for v in $(RELEASES_BUILT); do bash hack/release-bin.sh $$v; done

cluster-up: tools-cluster engines
	bash dev/cluster.sh up

cluster-down:
	bash dev/cluster.sh down

# Integration suites (tests/*.rs): real Redis servers and the dev cluster.
# olm_e2e installs 0.1.0's CRDs over the current ones, then upgrades: OLM
# refuses that while any Redis of a newer schema exists, and nothing may make
# one meanwhile. It runs alone, first. So do the ALONE_TESTS (suite:test):
# the first fills the node to a known room and needs that room to hold still
# for a minute (a pod of another test that went away let a deferred resize
# through once); the second moves 1,000 MB of large values between shards,
# which starved a TLS flip test of CPU when they ran side by side. The
# third applies deploy/install.yaml, whose ClusterRoleBinding
# redpilot-operator the harness deletes (as a legacy binding) whenever
# another test starts an operator: side by side in the pool, the installed
# operator lost its rights and never reconciled (a clean-clone run).
# Everything else runs in TEST_SLOTS slots (hack/test-pool.py), the longest
# jobs first: each test of the POOL suites is a job of its own, so no suite's
# one long test holds the others back; the LOCAL_SUITES (real servers, the S3
# server, promtool and files, no Kubernetes; some serialise their tests with
# a lock in the process) are a job each. Expected times are the last run's
# ($(CARGO_TARGET_DIR)/test-times.tsv), else hack/test-times.tsv; beside each
# job's seconds they hold its CPU seconds (the test process and the operators
# it ran). A job that used the CPU for under 5 % of its time waits on timers
# (cron minutes, cooldowns, deadlines, Prometheus's scrapes): TEST_LIGHT_SLOTS
# more slots take only those, so waiting fills idle cores, not a slot. A job
# that used the CPU for 20 % of its time or more is heavy: TEST_HEAVY_SLOTS
# of those at most run at once (three at once on two cores slowed each past
# its deadlines and cost the operators their leases).
LOCAL_SUITES := backup_agent crd_drift image insights_rules redis_basics redis_cluster redis_reshard \
	redis_failover redis_rdb redis_switchover redis_tls redis_topology redis_tuning setup_script
ALONE_SUITES := olm_e2e
ALONE_TESTS := operator_autopilot:a_grow_the_node_defers_keeps_the_template_and_servers_within_their_limits \
	operator_meetings:large_values_move_without_an_unplanned_failover \
	plain_install:kubectl_apply_of_install_yaml_runs_the_operator
POOL_SUITES := $(filter-out $(LOCAL_SUITES) $(ALONE_SUITES),$(sort $(basename $(notdir $(wildcard tests/*.rs)))))
# Long runs, behind `make test-long`; each capability they show has a case
# of its own in `make test`: TLS turned on and off on a running Redis
# (operator_security, Replication) and on a Cluster's bus, resharding 3 ->
# 4 -> 3 under writers and readers (operator_reshard's failpoint tests kill
# the operator mid-move), and a shard primary kill -9ed mid-move with the
# default user off (operator_meetings: resharding with it off, and a
# failover with it off, are cases of their own).
LONG_TESTS := operator_security:tls_is_turned_on_and_off_on_a_running_cluster_losing_no_write \
	operator_reshard:three_to_four_to_three_shards_under_writers_and_readers_across_an_operator_crash \
	operator_meetings:a_primary_giving_slots_killed_with_the_default_user_off_fails_over_and_the_moves_finish
# Four slots. With the test builds' dependencies optimised (Cargo.toml) a
# clean-clone run with three left the CPU under pressure 49 % of the pool's
# time (902 s of 1,845 s) and took 2,170 s in all; four took 1,722 s, but
# the memory autopilot's fill tests failed under that load (a blind fill
# OOM-killed the primary before its grow: how fast a grow follows a fill is
# what they measure). Those are QUIET_TESTS: they run first, one at a time,
# beside at most TEST_QUIET_WITH busy jobs (three slots' load, under which
# they passed), while the rest run four at a time. The tests' own CPU
# seconds miss the API server's: it is what a further slot shares.
QUIET_TESTS := operator_autopilot:a_fill_faster_than_a_step_is_sized_by_its_rate \
	operator_autopilot:the_autopilot_grows_in_place_before_oom_shrinks_and_stops_at_its_bounds \
	operator_cluster:the_memory_autopilot_grows_every_shard_in_place_without_oom
TEST_SLOTS ?= 4
TEST_QUIET_WITH ?= 2
TEST_LIGHT_SLOTS ?= 1
TEST_HEAVY_SLOTS ?= 2
PYTHON ?= python3
integration: engines
	$(CARGO) test --workspace --test "*" --no-run
	@status=0; $(CARGO) test --workspace $(addprefix --test ,$(ALONE_SUITES)) --no-fail-fast \
		|| status=$$?; \
	for t in $(ALONE_TESTS); do \
		$(CARGO) test --workspace --test $${t%%:*} -- --exact $${t#*:} || status=$$?; \
	done; \
	$(PYTHON) hack/test-pool.py --slots $(TEST_SLOTS) --light-slots $(TEST_LIGHT_SLOTS) --heavy-slots $(TEST_HEAVY_SLOTS) --split "$(POOL_SUITES)" \
		$(addprefix --quiet ,$(QUIET_TESTS)) --quiet-with $(TEST_QUIET_WITH) \
		--whole "$(LOCAL_SUITES)" $(addprefix --skip ,$(ALONE_TESTS) $(LONG_TESTS)) \
		--times "$${CARGO_TARGET_DIR:-target}/test-times.tsv" --seed hack/test-times.tsv \
		--logs "$${CARGO_TARGET_DIR:-target}/test-pool" || status=$$?; \
	exit $$status

# The long runs left out of `make test` (LONG_TESTS), then every chaos seed
# that once found a defect. The cluster comes down even when a step fails.
test-long: engines tools release-bins cluster-up
	@status=0; for t in $(LONG_TESTS); do \
		$(CARGO) test --workspace --test $${t%%:*} -- --exact $${t#*:} || status=$$?; \
	done; \
	$(MAKE) --no-print-directory chaos SEEDS=regressions || status=$$?; \
	$(MAKE) --no-print-directory cluster-down || true; \
	exit $$status

# The whole test run. The cluster comes down even when a step fails.
test: setup prune lint unit tools release-bins cluster-up
	@status=0; $(MAKE) --no-print-directory integration || status=$$?; \
	bash hack/stall-watch.sh report || true; \
	$(MAKE) --no-print-directory cluster-down || true; \
	exit $$status

# The composition harness (tests/chaos.rs): RUNS seeds from SEED, each a
# drawn Redis shape with a schedule of operations and faults over DURATION
# seconds, under writers of unique confirmed keys; invariants checked at the
# end, one line per run, a timeline per run in the cargo target's tmp/chaos/.
# ONLY=replication|cluster draws that mode only. SCHEDULE=<s>:<Action>,...
# runs that schedule instead of the drawn one (a shrunk one, say); SHRINK=1
# runs a failing seed again without each event in turn and prints the
# smallest schedule that still fails, with its replay command. Each run also
# draws its timeline as seed-<n>.svg. JOBS=<j> runs j seeds at once (each in
# its own namespace with its own operator). SEEDS=regressions runs every seed
# that once found a defect (SEEDS=4,6,12: those), DURATION 40 for them.
# `make test` runs one short seed.
SEED ?= 1
SEEDS ?=
RUNS ?= 10
DURATION ?= $(if $(SEEDS),40,120)
ONLY ?=
SCHEDULE ?=
SHRINK ?=
JOBS ?= 1
chaos: engines cluster-up
	REDPILOT_CHAOS_SEED=$(SEED) REDPILOT_CHAOS_SEEDS=$(SEEDS) REDPILOT_CHAOS_RUNS=$(RUNS) REDPILOT_CHAOS_DURATION=$(DURATION) REDPILOT_CHAOS_JOBS=$(JOBS) \
		REDPILOT_CHAOS_ONLY=$(ONLY) REDPILOT_CHAOS_SCHEDULE="$(SCHEDULE)" REDPILOT_CHAOS_SHRINK=$(SHRINK) \
		$(CARGO) test --test chaos -- --nocapture

# Scale measurements (benches/scale.rs): 100 real and 1,000 fake Redis on one
# operator; prints a table. Knobs: BENCH_REAL, BENCH_FAKE, BENCH_IDLE_SECS;
# BENCH_PROFILE=dev skips the optimised build (slower operator, quicker build).
BENCH_PROFILE ?= release
bench: cluster-up
	$(CARGO) bench --profile $(BENCH_PROFILE) --bench scale

# An idle operator's CPU and memory with 0, 1 and IDLE_REDIS (10) Replication
# Redis of real servers (benches/idle.rs); IDLE_SECS per window (120).
bench-idle: engines cluster-up
	$(CARGO) bench --profile $(BENCH_PROFILE) --bench idle

# The release link's function order (hack/hot-symbols.txt, read by build.rs):
# the functions an idle operator runs, from callgrind over bench-idle's
# window with 10 Redis (HOT_SECS long: longer than the 5-minute full pass).
# Needs valgrind. Run it again when the idle path changed much; a stale
# list orders less well and breaks nothing (names it lacks are passed over).
# The window is the run's one dump (part 1); callgrind's own file at exit is not used.
HOT_DIR ?= $(CURDIR)/.dev/hot-symbols
HOT_SECS ?= 420
hot-symbols: engines cluster-up
	@command -v valgrind >/dev/null || { echo "hot-symbols: install valgrind (apt-get install -y valgrind)"; exit 1; }
	$(CARGO) build --release --bin redpilot
	rm -rf $(HOT_DIR) && mkdir -p $(HOT_DIR)
	cp $${CARGO_TARGET_DIR:-target}/release/redpilot $(HOT_DIR)/redpilot
	IDLE_CALLGRIND=$(HOT_DIR) IDLE_OPERATOR_BIN=$(HOT_DIR)/redpilot IDLE_FEW_SECS=5 IDLE_SECS=$(HOT_SECS) \
		$(CARGO) bench --profile dev --bench idle
	python3 hack/hot-symbols.py "$$(ls $(HOT_DIR)/callgrind.out.*.1)" $(HOT_DIR)/redpilot > hack/hot-symbols.txt

# Failover measurements (tests/operator_failover.rs, tests/monitor_cost.rs):
# FAILOVER_RUNS runs of each fault (kill -9, pod deletion, partition) under
# counted writers, printing P4 p50/p99 and the writes lost; and the cost of
# failure detection with 1,000 watched primaries. `make test` runs one of each.
# BENCH_OPERATOR_BIN runs that operator binary under the test code (e.g. the
# release build, with BENCH_PROFILE=dev for the test code: its whole-program
# release build takes long).
FAILOVER_RUNS ?= 20
bench-failover: engines cluster-up
	REDPILOT_TEST_OPERATOR_BIN=$(BENCH_OPERATOR_BIN) \
	REDPILOT_FAILOVER_RUNS=$(FAILOVER_RUNS) $(CARGO) test --profile $(BENCH_PROFILE) \
		--test operator_failover -- --nocapture --test-threads=1 killed deleted partitioned
	REDPILOT_MONITOR_TARGETS=1000 $(CARGO) test --profile $(BENCH_PROFILE) \
		--test monitor_cost -- --nocapture

# Upgrade measurements (tests/operator_upgrade.rs): UPGRADE_RUNS walks of one
# Redis through Redis 6.2 -> 7.0 -> Valkey 8.1 -> 9.1 under four counted
# writers and a reader, printing per hop the write window p50/max, the
# upgrade time and the writes lost. `make test` walks it once.
UPGRADE_RUNS ?= 5
# Following a Redis outside (tests/operator_follow.rs): a new follower's
# catch-up rate from a FOLLOW_MIB (1024) source, its lag under a steady
# writer; `make test` runs the same with 64 MiB.
FOLLOW_MIB ?= 1024
# Point-in-time recovery (tests/operator_pitr.rs): the archive's recovery
# point under a steady writer, its cost to a writer's throughput, and a
# restore of a PITR_BASE_MB (1024) MiB base and PITR_WRITE_SECONDS (600)
# of writes; `make test` runs the same with 8 MiB and 10 s.
PITR_BASE_MB ?= 1024
PITR_WRITE_SECONDS ?= 600
bench-follow: engines cluster-up
	REDPILOT_FOLLOW_MIB=$(FOLLOW_MIB) $(CARGO) test --profile $(BENCH_PROFILE) --test operator_follow -- \
		--nocapture a_new_follower_catches_up

bench-pitr: engines cluster-up
	REDPILOT_PITR_BASE_MB=$(PITR_BASE_MB) REDPILOT_PITR_WRITE_SECONDS=$(PITR_WRITE_SECONDS) \
		$(CARGO) test --profile $(BENCH_PROFILE) --test operator_pitr -- --nocapture the_archive_keeps_up

bench-upgrade: engines cluster-up
	REDPILOT_UPGRADE_RUNS=$(UPGRADE_RUNS) $(CARGO) test --test operator_upgrade -- \
		--nocapture every_hop_upgrades_without_losing_a_write

# The memory autopilot's baseline (tests/operator_autopilot.rs): the same
# steady fill without the autopilot, refused with OOM; prints when and how
# much got in.
bench-autopilot: engines cluster-up
	$(CARGO) test --features long-tests --test operator_autopilot -- \
		--nocapture without_the_autopilot

# Apply → Ready (tests/operator_timing.rs): TIMING_RUNS creations of each kind
# (Standalone, Replication 3, Cluster 3 x 2 and 6 x 3) for medians, the
# apiserver requests per reconcile of an idle Replication and Cluster Redis,
# and the operator's idle CPU with one of each.
# `make test` creates one Standalone and one Replication.
TIMING_RUNS ?= 5
bench-timing: engines cluster-up
	REDPILOT_TIMING_RUNS=$(TIMING_RUNS) REDPILOT_TIMING_CLUSTER=1 $(CARGO) test \
		--test operator_timing -- --nocapture

# Cluster mode measurements: CLUSTER_RUNS shard-primary kill -9s of a 3 x 2
# Valkey 8.1 cluster under per-shard writers confirming with WAIT 1
# (tests/redis_cluster.rs), printing the time to writable again p50/p99 and
# the writes lost; then the operator's suite (tests/operator_cluster.rs),
# its shard-primary kill -9 repeated CLUSTER_RUNS times with the operator in
# charge (p50/p99), and CLUSTER_UPGRADE_RUNS upgrades of a 3 x 2 Cluster
# Redis from Redis 7.0 to Valkey 8.1 under per-shard writers (per-shard
# longest write gap p50/max, writes lost, time to Succeeded). `make test`
# runs each once.
CLUSTER_RUNS ?= 10
CLUSTER_UPGRADE_RUNS ?= 5
bench-cluster: engines cluster-up
	REDPILOT_CLUSTER_RUNS=$(CLUSTER_RUNS) $(CARGO) test --test redis_cluster -- \
		--nocapture a_killed_shard_primary
	REDPILOT_CLUSTER_OP_RUNS=$(CLUSTER_RUNS) $(CARGO) test --test operator_cluster -- \
		--nocapture a_cluster_redis_forms
	REDPILOT_CLUSTER_UPGRADE_RUNS=$(CLUSTER_UPGRADE_RUNS) $(CARGO) test --test operator_cluster -- \
		--nocapture --skip a_cluster_redis_forms

# Online resharding at size (tests/operator_reshard.rs): a 3 x 2 Valkey 8.1
# Cluster Redis filled with RESHARD_TAGS x 4 keys of four types whose values
# total about RESHARD_TAGS x 4 x RESHARD_VALUE bytes (default 100,000 keys,
# ~200 MiB), under four WAIT-confirmed writers and four readers: the operator
# stopped mid-move, the source primary killed and the count set back, then
# 3 -> RESHARD_TO (default 5) -> 3 shards; slots and MiB per second, client
# errors by kind, writes lost. Beside it, Valkey 9.1's atomic path 3 -> 4.
# `make test` runs both at 10,000 keys and 3 -> 4 -> 3. Then benches/reshard.rs
# moves the same data on each path (Valkey 8.1 classic, 9.1 atomic), 3 ->
# RESHARD_TO -> 3 with nothing stopped, beside valkey-cli --cluster rebalance
# on the same keys, each step without and with writers (RESHARD_WRITERS,
# default 0,2), and prints the moves alone, slots, keys and MiB per second;
# RESHARD_VERSIONS and RESHARD_TOOLS narrow it.
RESHARD_TAGS ?= 25000
RESHARD_VALUE ?= 2048
RESHARD_TO ?= 5
bench-reshard: engines cluster-up
	REDPILOT_RESHARD_TAGS=$(RESHARD_TAGS) REDPILOT_RESHARD_VALUE=$(RESHARD_VALUE) \
		REDPILOT_RESHARD_TO=$(RESHARD_TO) $(CARGO) test --test operator_reshard -- --nocapture
	RESHARD_TAGS=$(RESHARD_TAGS) RESHARD_VALUE=$(RESHARD_VALUE) RESHARD_TO=$(RESHARD_TO) \
		$(CARGO) bench --profile $(BENCH_PROFILE) --bench reshard

# Backup measurements (tests/backup_agent.rs): a BACKUP_MB MiB snapshot
# streamed by the optimised agent into the S3 server, against
# `redis-cli --rdb` to disk from the same server; prints both rates and the
# agent's peak RSS. `make test` runs it at 100 MiB with the test build.
BACKUP_MB ?= 1024
bench-backup: engines tools-versitygw
	$(CARGO) build --release --bin redpilot
	REDPILOT_BACKUP_MB=$(BACKUP_MB) REDPILOT_AGENT_BIN=$${CARGO_TARGET_DIR:-target}/release/redpilot \
		$(CARGO) test --test backup_agent -- --nocapture backup_throughput

# Backup and restore on the dev cluster at BACKUP_MB MiB (tests/operator_backup.rs):
# a RedisBackup of a 3-instance Redis to the S3 server, then a new
# 3-instance Redis bootstrapped from it, to Ready with every key.
bench-restore: engines tools-versitygw cluster-up
	REDPILOT_BACKUP_MB=$(BACKUP_MB) $(CARGO) test --test operator_backup -- --nocapture backup_to_s3

# Tuning advice's cost (benches/tuning.rs): the operator's look at 1, 100
# and BENCH_SERVERS (1000) real Redis 7.0 servers (CPU, commands and bytes
# per look), and key sampling's effect on a loaded replica's latency. No
# cluster; `make test` checks one look's cost (tests/redis_tuning.rs).
bench-tuning: engines
	$(CARGO) bench --profile $(BENCH_PROFILE) --bench tuning

# TLS measurements (hack/tls-bench.sh) on Redis 7.0: SET/GET through TLS vs
# plain text, a replica's full sync over each, and the cost of a live
# certificate reload. Knobs: BENCH_CLIENTS, BENCH_REQUESTS, BENCH_VALUE,
# BENCH_SYNC_MB.
bench-tls: engines
	bash hack/tls-bench.sh

# The tools and engines are built by dev/run.sh, beside the operator's build.
run: setup
	bash dev/run.sh

run-stop:
	@if [ -f .dev/operator.pid ]; then kill $$(cat .dev/operator.pid) 2>/dev/null || true; rm -f .dev/operator.pid; echo "operator stopped"; fi

version:
	$(CARGO) run --quiet -- version

# The plain install without OLM (deploy/install.yaml, from the bundle's
# sources; tests/plain_install.rs fails when it drifts).
install-yaml:
	bash hack/install.sh

# The operator image, built without a container engine (hack/image.sh,
# tools/image/): dist/image/oci (OCI layout) and dist/image/redpilot-VERSION.tar
# (`docker load`); the same inputs give the same digest.
image: tools-image
	$(CARGO) build --release --bin redpilot --bin redpilot-exporter
	bash hack/image.sh

# A registry for the images below: bin/crane registry serve on $(REGISTRY),
# blobs in .dev/registry/ (manifests live in the process: a restarted
# registry needs a new `make catalog-image`).
REGISTRY ?= 127.0.0.1:5100
registry: tools-image
	@if curl -fsS -o /dev/null http://$(REGISTRY)/v2/ 2>/dev/null; then \
		echo "registry: http://$(REGISTRY)/v2/ answers"; \
	else \
		mkdir -p .dev/registry; \
		nohup bin/crane registry serve --address $(REGISTRY) --disk .dev/registry \
			>.dev/registry.log 2>&1 & echo $$! >.dev/registry.pid; \
		for i in $$(seq 50); do curl -fsS -o /dev/null http://$(REGISTRY)/v2/ 2>/dev/null && break; sleep 0.1; done; \
		curl -fsS -o /dev/null http://$(REGISTRY)/v2/ || { echo "registry: did not start; see .dev/registry.log" >&2; exit 1; }; \
		echo "registry: serving http://$(REGISTRY)/v2/ (pid $$(cat .dev/registry.pid), log .dev/registry.log)"; \
	fi

registry-down:
	@if [ -f .dev/registry.pid ]; then kill $$(cat .dev/registry.pid) 2>/dev/null || true; rm -f .dev/registry.pid; fi

# Publishing (hack/publish.sh) to $(REGISTRY): each release's operator image
# and bundle image (its CSV naming the operator by digest), the catalog
# image rendered from the pushed bundles by `opm alpha render-template
# semver`, and the two helper images OLM unpacks bundles with. References
# with digests in dist/publish/images.env.
bundle-image: tools registry release-bins
	$(CARGO) build --release --bin redpilot --bin redpilot-exporter
	REGISTRY=$(REGISTRY) bash hack/publish.sh

catalog-image: bundle-image

# The Helm chart deploy/helm/redpilot, from the same sources (a test checks).
helm-chart:
	bash hack/helm.sh

# The kubectl plugin: bin/kubectl-redpilot (put bin/ on the PATH, then
# `kubectl redpilot status <redis>`).
plugin:
	$(CARGO) build --release --bin kubectl-redpilot
	ln -sf $${CARGO_TARGET_DIR:-$(CURDIR)/target}/release/kubectl-redpilot bin/kubectl-redpilot

# OLM packaging (hack/bundle.sh, hack/catalog.sh). `make bundle VERSION=x.y.z`
# regenerates bundle/ and bundle.Dockerfile (VERSION defaults to Cargo.toml's);
# `make catalog` renders bundle/ into the file-based catalog in catalog/.
# The tests/olm_*.rs suites fail when the checked-in output drifts.
bundle: tools-operator-sdk
	bash hack/bundle.sh $(VERSION)

catalog: tools-opm
	bash hack/catalog.sh

olm-validate: tools-operator-sdk tools-opm
	bin/operator-sdk bundle validate ./bundle --select-optional suite=operatorframework
	bin/opm validate catalog && echo "opm validate catalog: valid"

clean: cluster-down
	$(CARGO) clean
	rm -rf bin .dev
