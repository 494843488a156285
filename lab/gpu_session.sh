#!/usr/bin/env bash
# The lab's runbook for device calls: one case a call, each under the device's 10 minutes (one H100 or
# H200; logs and JSONs under $OUT). Usage, from the repository root:
#     bash lab/gpu_session.sh 1      # then 2, then 3
# 1: the table's dealing compared (qwen drafts) and the draft form's correctness log (every family);
# 2: the verify pass as one step launch, and both models persistent in one launch (cross_step);
# 3: both models persistent side by side on split SMs (step_share);
# short: the step form's checks at 5 and 32 sequences at the current defaults, the launch defaults
#        against the epilogues through the sums and the depths before them, and the product's dealing where it
#        balances (qwen2.5-1.5b), cut to fit one call; short2: the verify pass, and the epilogues through the
#        sums and the wgmma depth on the other drafts; ring_default: the draft phase's record and the step
#        form's checks at the launch's defaults (attention's history through the loader's ring; the cases
#        that measured it are in 5050a07's runbook; ring_default_short, ring_min: cut to fit a short
#        budget); split_finish: a split tile's pieces through shared atomic sums or a slot each; handoff: a
#        stage's handoff by counter or by flags in the data; critical: the launch's critical path stage by stage
#        on every example (lab/step_stages/critical.py); defaults: the checks and the four aims' draft phase at the
#        launch's defaults; ledger: `conjugate profile` of the step plan (the round's ledger inside the
#        step launch); merge: attention's chunk merge at once (merge_unrolled.patch) against the loop;
#        merged: lab/stream_chain's MLP blocks as one stage
#        (merged, folded) against two (lab/step_stages' fewer stages); narrow: whole-K narrow tiles against split K in a
#        chain of dependent GEMMs (lab/narrow_tiles); verify49: #49's record (the B=32 example's kernel
#        sweep, then every example's verify phase against its floor, by the tile kernel and with the
#        target's o_proj and down streamed, each also with the GPU's tile table, benchmarks/verify_kernels.py);
#        streamed_checks: the streamed kernel's correctness log (benchmarks/streamed_checks.py);
#        streamed_pdl: every example's verify phase, tile kernel and streamed, each plain and as
#        programmatic dependent launches released at the start, with each phase's ledger (time per op
#        kind); draft_streamed: the same for the draft's phase (PDL at the end); fused: four examples'
#        verify phase with the target's norms and RoPE folded into its GEMMs too (fused5: the
#        product's statistics read in its main loop against the former order, the kernels, the drafts' phases and
#        the target's gate_up fused alone); tuned: the verify phase with the GPU's tile table's tiles; serving_sweep: #49's
#        GEMM shapes at serving sizes, resumed over calls; search48: #48's search (qwen3-06b-8b-b4, the step form among the
#        edits); search49: the B=32
#        example's search, 40 evaluations over calls (its database carried); share: the draft's step
#        launch on part of the SMs, alone and beside the target's stream (lab/step_share); attention: the
#        target's attention over #49's grid of batches and contexts, beside a launch reading its bytes
#        (attn_examples: the examples' own attention shapes); combine: the attention's split merge made
#        lighter against the product's (lab/attention_combine; harness_gap: the sweep's attention timing
#        against that harness's); auto: phases on an H200 (the tile table rebuilt since verify49 ran), else
#        compute_retime (compute's tall tiles beside the serving sweep's best in one process); reads: the read launches
#        (stream_read beside the row sums) and cuBLAS over the known tiles;
#        retime_h200: the H200's sweeps' known tiles timed again with the paired flush timing; compute: the
#        target's GEMMs past 128 rows with the tall tiles a Hopper matmul runs at, beside cuBLAS; tall_gemm:
#        lab/tall_gemm's TMA, grouped, persistent GEMM past 128 rows against cuBLAS and the template;
#        retime: the flush probe, both attention sweeps and the B=32 example's sweep with the paired flush timing;
#        serving_retime: the serving sweep's shipped and best tiles timed again that way; phases: every example's verify
#        phase with the GPU's table; auto2: a short call's choice (phases on an H200, else serving_retime).
# Name the commit sent in the command, expanded here: `CONJUGATE_CODE=<git rev-parse --short HEAD>[+changes]
# bash lab/gpu_session.sh CASE` (the device's own git named the session's first commit "+changes" for a later
# tree; benchmarks/common.py records the named one). What a case leaves under $OUT comes back as one
# archive, session-CASE.tar.gz (cases run one after another in a call each leave theirs). Every script
# checks before it times; a failing variant is a row, not the end of the call.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
# the checkout on the path (an editable install needs the network for its build backend, which the device lacks)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the device returns at most 8 files: what a case leaves under $OUT goes as one archive, session-CASE.tar.gz
bundle() { (cd "$out" && tar czf "/tmp/session-$1.tar.gz" --exclude '*.tar.gz' . && find . -maxdepth 1 ! -name . \
    ! -name '*.tar.gz' -exec rm -rf {} + && mv "/tmp/session-$1.tar.gz" .); }
trap "bundle ${1:-none}" EXIT
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
[ -n "${CONJUGATE_CODE:-}" ] || echo "note: no CONJUGATE_CODE: the JSONs name the device's stale commit" >&2
run() {  # seconds, log name, command...
    local limit=$1 name=$2; shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1; echo "   exit $? ($name)"
    grep -v -i warn "$out/$name.log" | tail -12
}
merge_patch() {  # lab/step_stages' merge_unrolled code (kept out of the product until it measures a win) on this copy
    git apply lab/step_stages/merge_unrolled.patch || { echo "lab/step_stages/merge_unrolled.patch does not apply to this tree" >&2
                                                        exit 1; }
}
wheels() {  # the image lacks sqlalchemy: its wheels travel as .whl (carry [".whl"]; python3 -m pip download
    # sqlalchemy 2.x and greenlet for cp312 manylinux, as the device README says)
    if ls .whl/*.whl > /dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"; fi
}
search() {  # log name, workload, database: a 40-evaluation search resumed from the database where the call carries
    # it (copy the returned one to runs/ and carry [".whl", "runs/DB"]), else started on the workload
    local name=$1 workload=$2 db=$3 evaluator=benchmarks/profiles/h100_quick.toml how
    grep -q H200 "$out/gpu.txt" && evaluator=h200
    if [ -f "runs/$db" ]; then how=(--resume "runs/$db" --carry-baselines); else how=("$workload" --db "runs/$db"); fi
    wheels
    run 570 "$name" python -m conjugate search "${how[@]}" --evaluator "$evaluator" --budget 40 --time 8m
    cp "runs/$db" "$out/$db"
}
case "${1:-}" in
1)
    run 270 dealing python lab/step_dealing/dealing.py examples/qwen25-05b-7b-b8.toml \
        examples/qwen3-06b-8b-b4.toml examples/qwen25-15b-14b-b4.toml --variants round_robin balanced_2 \
        --json "$out/dealing.json"
    run 290 step_checks python benchmarks/step_checks.py --json "$out/step_checks.json" ;;
2)
    run 260 verify python lab/verify_step/verify.py examples/llama-1b-8b-b1.toml examples/qwen3-06b-8b-b4.toml \
        examples/llama-1b-8b-b8.toml --json "$out/verify.json"
    run 280 cross python lab/cross_step/cross.py examples/qwen3-06b-8b-b4.toml examples/llama-1b-8b-b1.toml \
        examples/qwen25-05b-7b-b8.toml --json "$out/cross.json" ;;
3)
    run 290 share_pair python lab/step_share/pair.py examples/qwen3-06b-8b-b4.toml examples/llama-1b-8b-b1.toml \
        --draft-sms 40 64 88 --json "$out/share_pair.json" ;;
short)  # one call when the session has time for one: the product's checks, its launch defaults, its dealing
    run 150 step_checks python benchmarks/step_checks.py --batches 5 32 --json "$out/step_checks.json"
    run 250 variants python lab/step_variants/variants.py examples/qwen3-06b-8b-b4.toml \
        examples/qwen25-05b-7b-b8.toml --variants default direct_epilogue=0 mma_depth=1 attention_buffers=1 \
        --json "$out/variants.json"
    run 140 dealing python lab/step_dealing/dealing.py examples/qwen25-15b-14b-b4.toml \
        --variants product round_robin balanced_2 --json "$out/dealing.json" ;;
short2)  # the call after short: the verify pass, and the wgmma depth on the other drafts
    run 250 verify python lab/verify_step/verify.py examples/llama-1b-8b-b1.toml examples/qwen25-05b-7b-b8.toml \
        examples/llama-1b-3b-b16-ctx4k.toml --json "$out/verify.json"
    run 250 variants2 python lab/step_variants/variants.py examples/llama-1b-8b-b8.toml \
        examples/llama-1b-8b-b1.toml examples/qwen25-15b-14b-b4.toml --variants default direct_epilogue=0 mma_depth=1 \
        --json "$out/variants2.json" ;;
ring_default)  # ring_kv on by default (lab/step_stages/h100_ring_kv.json): the draft phase's record on this card (the
    # H200's four aims, or the H100's examples), then the step form's checks for every family's draft, k 1 and 8
    if grep -q H200 "$out/gpu.txt"; then
        run 330 draft_step python benchmarks/draft_step.py examples/qwen3-06b-8b-b4.toml \
            benchmarks/workloads/qwen3-06b-8b-b1-k7-ctx2k.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml \
            --json "$out/draft_step_h200.json"
    else
        run 330 draft_step python benchmarks/draft_step.py examples/llama-1b-8b-b1.toml examples/llama-1b-8b-b8.toml \
            examples/qwen25-05b-7b-b8.toml examples/qwen3-06b-8b-b4.toml examples/llama-1b-3b-b16-ctx4k.toml \
            examples/qwen25-15b-14b-b4.toml benchmarks/workloads/qwen3-06b-8b-b1-k7-ctx2k.toml \
            --json "$out/draft_step_h100.json"
    fi
    run 200 step_checks python benchmarks/step_checks.py --batches 5 32 --json "$out/step_checks.json" ;;
ring_default_short)  # ring_default cut for a short budget: #48's four aims' draft phase on this card, then the
    # checks of the drafts the option's own checks left out (llama-3.2-1b, qwen2.5-1.5b), k 8
    card=h100; grep -q H200 "$out/gpu.txt" && card=h200
    run 200 draft_step python benchmarks/draft_step.py examples/qwen3-06b-8b-b4.toml \
        benchmarks/workloads/qwen3-06b-8b-b1-k7-ctx2k.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml \
        --json "$out/draft_step_$card.json"
    run 120 step_checks python benchmarks/step_checks.py --models llama-3.2-1b qwen2.5-1.5b --batches 5 32 --steps 8 \
        --json "$out/step_checks.json" ;;
ring_min)  # ring_default at its least (about 210 s): the checks of the drafts ring_kv's own checks left out (k 8),
    # then the example #48's search aim names, its draft phase on this card
    card=h100; grep -q H200 "$out/gpu.txt" && card=h200
    run 100 step_checks python benchmarks/step_checks.py --models llama-3.2-1b qwen2.5-1.5b --batches 5 32 --steps 8 \
        --json "$out/step_checks.json"
    run 110 draft_step python benchmarks/draft_step.py examples/qwen3-06b-8b-b4.toml --json "$out/draft_step_$card.json" ;;
split_finish)  # lab/split_finish: a split tile's pieces through shared atomic sums against a slot each, alone and
    # beside a read stream (about 120 s)
    run 200 split_finish python lab/split_finish/probe.py --json "$out/split_finish.json" ;;
defaults)  # the launch's defaults since the epilogues' inputs load early (lab/step_stages/h100_early.json): the
    # step form's checks for every family's draft (k 1 and 8, 5 and 32 sequences), then #48's four aims'
    # draft phase on this card (about 350 s)
    card=h100; grep -q H200 "$out/gpu.txt" && card=h200
    run 200 step_checks python benchmarks/step_checks.py --batches 5 32 --json "$out/step_checks.json"
    run 300 draft_step python benchmarks/draft_step.py examples/qwen3-06b-8b-b4.toml \
        benchmarks/workloads/qwen3-06b-8b-b1-k7-ctx2k.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml \
        --json "$out/draft_step_$card.json"
    python lab/step_stages/critical.py "$out/draft_step_$card.json" | tee "$out/critical_$card.md" ;;
ledger)  # the round's ledger inside the step launch on a GPU: `conjugate profile` of the shipped step plan, each
    # step kind's share of the launch from its stamped run (needs sqlalchemy: carry [".whl"])
    wheels
    run 200 profile_step python -m conjugate profile examples/qwen3-06b-8b-b4.toml --plan step --json "$out/profile_step.json" ;;
merge)  # attention's chunk merge at once (launch option merge_unrolled, lab/step_stages/merge_unrolled.patch, applied
    # first) against the loop, every example in one process, each variant checked first (about 300 s); then the
    # option's checks on every draft, k 8 (about 80 s)
    merge_patch
    run 420 merge python lab/step_variants/variants.py examples/qwen3-06b-8b-b4.toml \
        benchmarks/workloads/qwen3-06b-8b-b1-k7-ctx2k.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml \
        examples/llama-1b-8b-b1.toml examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-15b-14b-b4.toml \
        --variants default merge_unrolled=1 --passes 2 --json "$out/merge.json"
    run 150 merge_checks python benchmarks/step_checks.py --batches 1 5 32 --steps 8 --launch merge_unrolled=1 \
        --json "$out/merge_checks.json"
    python lab/step_stages/critical.py "$out/merge.json" --variant merge_unrolled=1 | tee "$out/merge_critical.md" ;;
critical)  # the launch's critical path at its defaults (ledger.critical_path), every example's draft phase in one
    # process, each checked first (about 250 s); then the table (lab/step_stages/critical.py)
    run 420 critical python lab/step_variants/variants.py examples/qwen3-06b-8b-b4.toml \
        benchmarks/workloads/qwen3-06b-8b-b1-k7-ctx2k.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml \
        examples/llama-1b-8b-b1.toml examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-15b-14b-b4.toml \
        --variants default --passes 1 --json "$out/critical.json"
    python lab/step_stages/critical.py "$out/critical.json" | tee "$out/critical.md" ;;
handoff)  # lab/handoff: a dependent stage's handoff by a done counter and a poll, against flags carried in the
    # data (an epoch in every 8-byte word), alone and beside a read stream (about 120 s)
    run 240 handoff python lab/handoff/chain.py --json "$out/handoff.json" ;;
narrow)
    run 300 narrow python lab/narrow_tiles/chain.py --json "$out/narrow.json" ;;
merged)  # lab/stream_chain: each MLP block one stage (gate_up and down in one task) against two, one process
    run 400 merged python lab/stream_chain/chain.py --forms staged merged folded --models llama-3.2-1b qwen3-0.6b \
        qwen2.5-0.5b --layers 16 --batches 1 8 16 --json "$out/merged.json" ;;
verify49)  # #49's H200 record: the B=32 example's sweep, then every example's verify phase, tile kernel and streamed, tuned
    run 250 sweep_b32 python benchmarks/kernel_sweep.py examples/llama-1b-8b-b32.toml --per-shape 16 --prewarm 15 --read \
        --json "$out/kernel_sweep_b32.json"
    run 300 verify_kernels python benchmarks/verify_kernels.py examples/llama-1b-8b-b32.toml \
        examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-15b-14b-b4.toml examples/qwen3-06b-8b-b4.toml \
        examples/llama-1b-8b-b8.toml examples/llama-1b-8b-b1.toml examples/qwen25-05b-7b-b8.toml \
        --sweeps "$out/kernel_sweep_b32.json" --streamed --tuned --json "$out/verify_kernels.json" ;;
streamed_pdl)  # the verify phase with programmatic dependent launches, tile kernel and streamed, every example
    run 240 verify_pdl python benchmarks/verify_kernels.py examples/llama-1b-8b-b32.toml \
        examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-15b-14b-b4.toml examples/qwen3-06b-8b-b4.toml \
        examples/llama-1b-8b-b8.toml examples/llama-1b-8b-b1.toml examples/qwen25-05b-7b-b8.toml \
        --streamed --pdl start --ledger --json "$out/verify_pdl.json" ;;
draft_streamed)  # the draft's phase with its o_proj and down streamed: does `draft.streamed` pay anywhere?
    run 300 draft_streamed python benchmarks/verify_kernels.py examples/llama-1b-8b-b32.toml \
        examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-15b-14b-b4.toml examples/qwen3-06b-8b-b4.toml \
        examples/llama-1b-8b-b8.toml examples/llama-1b-8b-b1.toml examples/qwen25-05b-7b-b8.toml \
        --model draft --streamed --pdl end --ledger --json "$out/draft_streamed.json" ;;
fused)  # the target's norms (and RoPE) folded into its GEMMs in the verify phase, tile kernel and streamed
    run 420 verify_fused python benchmarks/verify_kernels.py examples/llama-1b-8b-b1.toml \
        examples/qwen3-06b-8b-b4.toml examples/llama-1b-8b-b8.toml examples/llama-1b-8b-b32.toml \
        --streamed --pdl start --fusions attn_norm+qkv qkv+rope_kv mlp_norm+gate_up --ledger \
        --json "$out/verify_fused.json" ;;
fused5)  # the product's statistics read in its main loop (gemm.py): the kernels alone in that
    # order and the former one, the drafts' phases with their norms fused in both, and the target's gate_up fused alone
    run 60 prologue python lab/fused_norms/prologue.py --json "$out/prologue.json"
    run 60 prologue_before python lab/fused_norms/prologue.py --stats-order prologue --json "$out/prologue_before.json"
    drafts=(examples/qwen3-06b-8b-b4.toml examples/qwen25-05b-7b-b8.toml --model draft --pdl end --ledger
        --fusions attn_norm+qkv qkv+rope_kv mlp_norm+gate_up final_norm+lm_head)
    run 120 draft_product python benchmarks/verify_kernels.py "${drafts[@]}" --json "$out/draft_product.json"
    run 120 draft_before python lab/fused_norms/stats_order.py prologue "${drafts[@]}" --json "$out/draft_before.json"
    run 100 gate_up_b1 python benchmarks/verify_kernels.py examples/llama-1b-8b-b1.toml --streamed --pdl start \
        --fusions mlp_norm+gate_up --ledger --json "$out/gate_up_b1.json"
    run 100 gate_up_qwen3 python benchmarks/verify_kernels.py examples/qwen3-06b-8b-b4.toml --pdl start \
        --fusions mlp_norm+gate_up --ledger --json "$out/gate_up_qwen3.json" ;;
combine)  # the attention's lighter split merge (lab/attention_combine) against the product's, in one process
    run 560 combine python lab/attention_combine/time_merge.py --limit-s 420 --json "$out/combine.json" ;;
flush_drift)  # whether the L2 flush's subtracted time drifts within a process (lab/attention_combine)
    run 45 flush_drift python lab/attention_combine/flush_drift.py --json "$out/flush_drift.json" ;;
retime)  # the sweeps again with the flushes' time taken off pair by pair (timing.time_per_call): the flush probe,
    # the target's attention grid and the examples' attention shapes, then the B=32 example's GEMMs
    run 60 flush_drift python lab/attention_combine/flush_drift.py --cold --rounds 2 --json "$out/flush_drift.json"
    run 150 attention python benchmarks/kernel_sweep.py examples/llama-1b-8b-b1.toml --kinds attn --models target \
        --batches 1 4 16 64 --contexts 512 2048 8192 --per-shape 12 --prewarm 15 --read --json "$out/attention_sweep.json"
    run 100 attn_examples python benchmarks/kernel_sweep.py examples/*.toml --kinds attn --models target \
        --per-shape 16 --prewarm 15 --read --json "$out/attn_examples.json"
    run 250 sweep_b32 python benchmarks/kernel_sweep.py examples/llama-1b-8b-b32.toml --per-shape 16 --prewarm 15 --read \
        --json "$out/kernel_sweep_b32.json" ;;
serving_retime)  # the serving sweep's shipped and best tiles timed again with the paired flush timing (--tiles-from)
    [ -f runs/serving_retime.json ] && cp runs/serving_retime.json "$out/serving_retime.json"
    run "${SWEEP_LIMIT:-540}" serving_retime python benchmarks/kernel_sweep.py examples/*.toml --kinds qkv o_proj gate_up down \
        --batches 16 32 64 --ks 1 3 5 7 --tiles-from benchmarks/results/serving_sweep_h100.json --prewarm 15 --read \
        --resume --json "$out/serving_retime.json" ;;
phases)  # every example's verify phase against its floor (tile kernel and streamed, PDL at the start, with the GPU's table)
    run "${VERIFY_LIMIT:-300}" verify_kernels python benchmarks/verify_kernels.py examples/llama-1b-8b-b32.toml \
        examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-15b-14b-b4.toml examples/qwen3-06b-8b-b4.toml \
        examples/llama-1b-8b-b8.toml examples/llama-1b-8b-b1.toml examples/qwen25-05b-7b-b8.toml \
        --streamed --pdl start --tuned --ledger --json "$out/verify_kernels.json" ;;
auto2)  # what a short call does with whatever card comes: the H200's phases (#49), else serving_retime
    trap - EXIT
    if grep -q H200 "$out/gpu.txt"; then bash "$0" phases; else bash "$0" serving_retime; fi ;;
harness_gap)  # why the kernel sweep and time_merge.py time the product's B=1 attention apart (lab/attention_combine)
    run 150 harness_gap python lab/attention_combine/harness_gap.py --json "$out/harness_gap.json" ;;
tuned)  # the verify phase with the GPU's tile table's tiles (search/tiles.json) against sequential's one tile a kind:
    # the H100's table lists the B=32 example's 128-row shapes and, since the serving sweep, the B=16 example's (the
    # H200 takes them too: its own table lacks them), the H200's the other examples'
    if grep -q H200 "$out/gpu.txt"; then more=(examples/llama-1b-8b-b8.toml examples/qwen3-06b-8b-b4.toml \
        examples/llama-1b-8b-b1.toml examples/qwen25-05b-7b-b8.toml examples/llama-1b-3b-b16-ctx4k.toml)
    else more=(examples/llama-1b-3b-b16-ctx4k.toml); fi
    run 400 verify_tuned python benchmarks/verify_kernels.py examples/llama-1b-8b-b32.toml "${more[@]}" --streamed --tuned \
        --ledger --json "$out/verify_tuned.json" ;;
serving_sweep)  # #49 item 3: the examples' GEMMs at batches 16, 32 and 64 and k 1-7 (236 shapes), over calls
    # (SWEEP_LIMIT: its seconds in this call, 560 unless set):
    # before the next call copy the returned serving_sweep.json to runs/ and give the run tool carry ["runs/serving_sweep.json"]
    [ -f runs/serving_sweep.json ] && cp runs/serving_sweep.json "$out/serving_sweep.json"
    run "${SWEEP_LIMIT:-560}" serving_sweep python benchmarks/kernel_sweep.py examples/*.toml --kinds qkv o_proj gate_up down \
        --batches 16 32 64 --ks 1 3 5 7 --per-shape 16 --read --resume --json "$out/serving_sweep.json" ;;
search48)  # #48's search: qwen3-06b-8b-b4, the step form among the heuristic's edits (it proposes it for
    # one-stream plans), resumable over calls (runs/q3.db)
    search search48 examples/qwen3-06b-8b-b4.toml q3.db ;;
search49)  # the B=32 example's search (#49 asks 40 evaluations or more), resumable over calls (runs/b32.db)
    search search49 examples/llama-1b-8b-b32.toml b32.db ;;
share)  # #48: the step launch on P programs alone, and on P SMs beside the target's stream (the H100 search's plan)
    run 560 share python lab/step_share/share.py examples/qwen3-06b-8b-b4.toml --programs 132 64 --sms 40 64 88 \
        --base benchmarks/results/draft_step_plans/qwen3-06b-8b-b4-h100-search.json --json "$out/share.json" ;;
attention)  # #49 item 2's grid: the target's attention at batches 1-64 and contexts 512-8192, beside a launch reading its bytes
    run "${ATTN_LIMIT:-400}" attention python benchmarks/kernel_sweep.py examples/llama-1b-8b-b1.toml --kinds attn --models target \
        --batches 1 4 16 64 --contexts 512 2048 8192 --per-shape 12 --prewarm 15 --read --json "$out/attention_sweep.json" ;;
attn_examples)  # the examples' own target attention shapes (contexts 1024 and 4096), beside a launch reading their bytes
    run "${EXAMPLES_LIMIT:-150}" attn_examples python benchmarks/kernel_sweep.py examples/*.toml --kinds attn --models target \
        --per-shape 16 --prewarm 15 --read --json "$out/attn_examples.json" ;;
streamed_checks)  # the streamed kernel's correctness log on this GPU
    run 500 streamed_checks python benchmarks/streamed_checks.py --json "$out/streamed_checks.json" ;;
auto)  # the next call whatever card comes: on an H200 every example's verify phase with the rebuilt 120-tile
    # table (then search49, its own call), else the tall tiles beside the former best
    trap - EXIT
    if grep -q H200 "$out/gpu.txt"; then VERIFY_LIMIT=290 bash "$0" phases; else bash "$0" compute_retime; fi ;;
retime_h200)  # the H200's sweeps' shipped and best tiles timed again with the flush taken off pair by pair (d201728),
    # beside the read launches: then --tabulate them with the other sweeps under that timing (benchmarks/README.md's tiles)
    six=(examples/llama-1b-8b-b1.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml
        examples/qwen3-06b-8b-b4.toml examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-15b-14b-b4.toml)
    for model in target draft; do
        run 150 "retime_$model" python benchmarks/kernel_sweep.py "${six[@]}" --models "$model" \
            --tiles-from "benchmarks/results/kernel_sweep_${model}_h200.json" --prewarm 15 --read \
            --json "$out/kernel_retime_${model}.json"
    done ;;
compute)  # the target's GEMMs past 128 rows (B=32 and 64, k 5 and 7) with the tall compute tiles first, beside cuBLAS
    run "${COMPUTE_LIMIT:-420}" compute_sweep python benchmarks/kernel_sweep.py examples/llama-1b-8b-b1.toml examples/llama-1b-3b-b16-ctx4k.toml \
        examples/qwen25-05b-7b-b8.toml examples/qwen25-15b-14b-b4.toml examples/qwen3-06b-8b-b4.toml --models target \
        --kinds qkv o_proj gate_up down --batches 32 64 --ks 5 7 --per-shape 13 --prewarm 15 --cublas \
        --json "$out/compute_sweep.json" ;;
compute_retime)  # compute's tall tiles and the serving sweep's best tiles timed in one process (then --tabulate it last)
    run 300 compute_retime python benchmarks/kernel_sweep.py examples/llama-1b-8b-b1.toml \
        examples/llama-1b-3b-b16-ctx4k.toml examples/qwen25-05b-7b-b8.toml examples/qwen25-15b-14b-b4.toml \
        examples/qwen3-06b-8b-b4.toml --models target --kinds qkv o_proj gate_up down --batches 32 64 --ks 5 7 \
        --tiles-from benchmarks/results/serving_reads_h100.json benchmarks/results/compute_sweep_h100.json \
        --prewarm 15 --read --cublas --json "$out/compute_retime.json" ;;
tall_gemm)  # lab/tall_gemm: TMA loads, tall tiles and a persistent walk past 128 rows, against cuBLAS and the template
    run "${TALL_LIMIT:-400}" tall_gemm python lab/tall_gemm/compare.py --limit "${TALL_SHAPES:-24}" --json "$out/tall_gemm.json" ;;
reads)  # --read's launches (kernel_sweep.stream_read beside torch's row sums) and cuBLAS with each shape's known tiles
    run 80 b32_reads python benchmarks/kernel_sweep.py examples/llama-1b-8b-b32.toml --kinds qkv o_proj gate_up down \
        --tiles-from benchmarks/results/kernel_sweep_b32_h100.json --prewarm 15 --read --cublas \
        --json "$out/b32_reads.json"
    run 300 serving_reads python benchmarks/kernel_sweep.py examples/*.toml --kinds qkv o_proj gate_up down \
        --batches 16 32 64 --ks 1 3 5 7 --tiles-from benchmarks/results/serving_retime_h100.json --prewarm 15 --read \
        --cublas --json "$out/serving_reads.json"
    run 150 attention_reads python benchmarks/kernel_sweep.py examples/llama-1b-8b-b1.toml --kinds attn --models target \
        --batches 1 4 16 64 --contexts 512 2048 8192 --tiles-from benchmarks/results/attention_sweep_h100.json \
        --prewarm 15 --read --json "$out/attention_reads.json" ;;
*)
    echo "usage: bash lab/gpu_session.sh 1|2|3|short|short2|narrow|verify49|streamed_pdl|draft_streamed|fused|fused5|combine|harness_gap|flush_drift|retime|serving_retime|phases|auto2|reads|compute|compute_retime|tall_gemm|retime_h200|attn_examples|tuned|serving_sweep|search49|share|attention|streamed_checks|auto" >&2; exit 2 ;;
esac
