#!/usr/bin/env bash
# seq_mutants.sh - mutation testing of the seq layer: each mutant below breaks one of seq's
# invariants in a copy of src/seq/seq.c (never the tree itself); the copy is compiled and
# linked with a seq test against the built library (whose own seq object the linker then
# leaves out), and the test must fail.  A mutant that survives, or that no longer applies
# (its code changed: update the mutant), fails this script.  The unmutated copy must pass
# the same tests first, so that a failure means the mutant was caught.
#
# usage: seq_mutants.sh CC LIBKVCACHE_A SOURCE_DIR [-IDIR...] [--all] [MUTANT...]
#   -IDIR    more include directories (the library's: ctest passes them, generated headers
#            included); SOURCE_DIR/include, /src and /tests are always searched
#   --all    also run every whole test binary against each mutant and print which fail
#            (slower; by default each mutant runs only the tests it names)
#   MUTANT   run only these mutants (default: all)
# Registered with ctest as seq_mutation (release build).  Budget: well under a minute on
# two cores: one compile of seq.c per mutant, the tests compiled once.
set -euo pipefail

if [[ $# -lt 3 ]]; then
    echo "usage: $0 CC LIBKVCACHE_A SOURCE_DIR [-IDIR...] [--all] [MUTANT...]" >&2
    exit 2
fi
CC=$1
LIB=$(realpath "$2")
SRC=$(realpath "$3")
shift 3
INCS=""
while [[ ${1:-} == -I* ]]; do
    INCS+=" $1"
    shift
done
ALL=""
if [[ ${1:-} == --all ]]; then
    ALL=--all
    shift
fi
ONLY=("$@")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/seq-mutants.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

PKGS="cmocka libxxhash libcjson libcrypto"
CFLAGS="-std=c17 -O1 -D_GNU_SOURCE -w$INCS -I$SRC/include -I$SRC/src -I$SRC/tests $(pkg-config --cflags $PKGS)"
LIBS="$(pkg-config --libs $PKGS) -lm -lpthread"
TESTS=(test_seq test_seq_model)

for t in "${TESTS[@]}"; do
    $CC $CFLAGS -c "$SRC/tests/$t.c" -o "$WORK/$t.o"
done

# ---- applying a mutant -------------------------------------------------------------------
# sub FROM TO: replace the one occurrence of the literal text FROM in the mutant's seq.c
# (perl, which Debian always has: bash's own pattern matching is quadratic on a whole file).
MUT_FILE=""
sub() {
    local count
    count=$(FROM=$1 perl -0777 -ne 'my $n = () = /\Q$ENV{FROM}\E/g; print $n' "$MUT_FILE")
    if [[ $count != 1 ]]; then
        echo "mutant $NAME does not apply: its text is found $count times:" >&2
        printf '    %s\n' "$1" >&2
        return 1
    fi
    FROM=$1 TO=$2 perl -0777 -pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/' "$MUT_FILE"
}

# Compile $1/seq.c (the test binaries are linked on first use).
build() {
    $CC $CFLAGS -c "$1/seq.c" -o "$1/seq.o"
}

# run DIR TEST[:FILTER]: 0 if the test passes.  A crash or a hang counts as a failure.
run() {
    local bin=${2%%:*} filter=
    [[ $2 == *:* ]] && filter=${2#*:}
    if [[ ! -x $1/$bin ]]; then
        $CC "$WORK/$bin.o" "$1/seq.o" "$LIB" $LIBS -o "$1/$bin"
    fi
    # (the braces' 2>/dev/null keeps bash from reporting the abort of a caught mutant)
    { SEQ_TEST_FILTER=${filter:-*} timeout 60 "$1/$bin" >"$1/out.$bin" 2>&1; } 2>/dev/null
}

# ---- the mutants -------------------------------------------------------------------------
# Each sets KILLERS (the tests, as BINARY[:CMOCKA_FILTER], every one of which must fail) and
# applies its change with sub.  WHAT says what breaks, in a line.
MUTANTS=()
mutant() { MUTANTS+=("$1"); }

mutant cow_skipped
m_cow_skipped() {
    WHAT="copy-on-write skipped: a writer that shares its partial block writes into it"
    KILLERS="test_seq:forks_copy_one_block_per_child_only_when_unaligned test_seq_model"
    sub '*cow = b != KVC_NONE && kvc_pool_refcount(s->pool, b) > 1;' '*cow = false;'
    sub 'alone = kvc_pool_refcount(s->pool, q->g[g].v[q->n_reserved / s->bs]) == 1;' \
        'alone = true;'
}

mutant cow_fast_path
m_cow_fast_path() {
    WHAT="the decode fast path writes in place without checking that the block is unshared"
    KILLERS="test_seq:forks_copy_one_block_per_child_only_when_unaligned"
    sub 'alone = kvc_pool_refcount(s->pool, q->g[g].v[q->n_reserved / s->bs]) == 1;' \
        'alone = true;'
}

mutant last_sharer_copies
m_last_sharer_copies() {
    WHAT="the last sharer of a block copies it instead of writing in place"
    KILLERS="test_seq:forks_copy_one_block_per_child_only_when_unaligned test_seq:dead_beams_are_freed_first_so_survivors_write_in_place"
    sub '*cow = b != KVC_NONE && kvc_pool_refcount(s->pool, b) > 1;' \
        '*cow = b != KVC_NONE && kvc_pool_refcount(s->pool, b) >= 1;'
    sub 'alone = kvc_pool_refcount(s->pool, q->g[g].v[q->n_reserved / s->bs]) == 1;' \
        'alone = false;'
}

mutant rollback_keeps_blocks
m_rollback_keeps_blocks() {
    WHAT="rollback keeps the blocks that held only rolled-back positions"
    KILLERS="test_seq:rejecting_every_draft_leaves_no_trace test_seq_model"
    sub 'uint32_t keep = (uint32_t)div_up(n_reserved, s->bs);' \
        'uint32_t keep = (uint32_t)div_up(q->n_reserved, s->bs);'
}

mutant rollback_keeps_reservation
m_rollback_keeps_reservation() {
    WHAT="rollback leaves the rolled-back positions reserved"
    KILLERS="test_seq:drafts_and_rollback_check_their_arguments"
    sub '    q->n_reserved = n_reserved;
    q->n_computed = KVC_MIN(q->n_computed, n_tokens);' \
        '    q->n_computed = KVC_MIN(q->n_computed, n_tokens);'
}

mutant window_releases_early
m_window_releases_early() {
    WHAT="a sliding window releases a block that is still inside the window"
    KILLERS="test_seq:sliding_window_gives_memory_back_as_it_slides test_seq_model"
    sub 'size_t upto = KVC_MIN((limit + 1 - w) / s->bs, gr->n);' \
        'size_t upto = KVC_MIN((limit + 1 - w) / s->bs + 1, gr->n);'
}

mutant window_never_releases
m_window_never_releases() {
    WHAT="a sliding window never gives memory back"
    KILLERS="test_seq:sliding_window_gives_memory_back_as_it_slides"
    sub 'if (!w || limit + 1 <= w) continue;' 'continue;'
}

mutant deferred_free_skipped
m_deferred_free_skipped() {
    WHAT="destroy frees a sequence's blocks while a step in flight still uses them"
    KILLERS="test_seq:abort_during_a_step_defers_the_free_and_the_slot_reuse test_seq_model"
    sub 'int rc = q->n_inflight ? releasable(s, q) : release_from(s, q, 0);' \
        'int rc = release_from(s, q, 0);'
    sub '    if (q->n_inflight) {
        q->state = SLOT_ZOMBIE;' '    if (false) {
        q->state = SLOT_ZOMBIE;'
}

mutant dead_beams_last
m_dead_beams_last() {
    WHAT="a beam step frees the dead beams after the survivors reserved (they copy for nothing)"
    KILLERS="test_seq:dead_beams_are_freed_first_so_survivors_write_in_place"
    sub '        rc = release_from(s, q, 0);
        n_released += !rc;' '        n_released += 0;'
    sub '    for (uint32_t i = 0; i < n_beams; i++)
        if (!children[i]) retire(s, beams[i].slot);' ''
    sub '    KVC_ASSERT(taken == need);' '    KVC_ASSERT(taken == need);
    for (uint32_t i = 0; i < n_beams; i++)
        if (!children[i]) {
            (void)release_from(s, &s->slots[beams[i].slot], 0);
            retire(s, beams[i].slot);
        }'
}

mutant beam_step_not_undone
m_beam_step_not_undone() {
    WHAT="a beam step the pool refuses leaves the dead beams without their references"
    KILLERS="test_seq:beam_step_out_of_blocks_changes_nothing"
    sub '            for (uint32_t g = 0; g < s->params.n_groups; g++) reref(s, &q->g[g], 0);' ''
}

mutant beam_slots_overcounted
m_beam_slots_overcounted() {
    WHAT="a beam step counts a dead beam's slot as free while a step in flight keeps it"
    KILLERS="test_seq:beam_step_counts_only_the_slots_dead_beams_really_free"
    sub 'n_dead_free += !children[i] && !q->n_inflight;' 'n_dead_free += !children[i];'
}

mutant stale_generation_unchecked
m_stale_generation_unchecked() {
    WHAT="a handle's generation is not checked: a stale handle reaches its slot's new owner"
    KILLERS="test_seq:stale_handles_are_refused_and_change_nothing"
    sub 'if (q->state == SLOT_LIVE && q->gen == h.gen) return q;' \
        'if (q->state == SLOT_LIVE) return q;'
}

mutant generation_not_bumped
m_generation_not_bumped() {
    WHAT="destroy does not bump the generation: the next owner of the slot gets the old handle"
    KILLERS="test_seq:stale_handles_are_refused_and_change_nothing"
    sub 'q->gen = q->gen + 1 ? q->gen + 1 : 1;' 'q->gen = q->gen;'
}

mutant completion_rows_unchecked
m_completion_rows_unchecked() {
    WHAT="a step completion with permuted rows is accepted"
    KILLERS="test_seq:permuted_late_and_duplicate_completions_are_rejected"
    sub 'if (!kvc_seq_eq(rec->rows[i], rows[i])) {' 'if (false) {'
}

mutant hit_covers_last_token
m_hit_covers_last_token() {
    WHAT="a prefix hit may cover the prompt's last token (no logits to sample from)"
    KILLERS="test_seq:hybrid_hits_need_the_whole_prefix_and_the_last_window test_seq_model"
    sub 'size_t max_hit = (q->n_prompt - 1) / bs, hit = max_hit;' \
        'size_t max_hit = q->n_prompt / bs, hit = max_hit;'
}

mutant fork_takes_no_reference
m_fork_takes_no_reference() {
    WHAT="a fork shares its parent's blocks without taking references (freed under it)"
    KILLERS="test_seq:forks_copy_one_block_per_child_only_when_unaligned"
    sub '                int rc = kvc_pool_ref(s->pool, pg->v[i]);
                KVC_ASSERT(rc == 0); /* refs_fit */' '                int rc = 0;'
}

mutant duplicate_not_shared
m_duplicate_not_shared() {
    WHAT="a block identical to a cached one keeps its own copy (no sharing, the chain stops)"
    KILLERS="test_seq:lookup_reuses_computed_prompts_and_keeps_the_last_token"
    sub 'if (canon != b) { /* share the identical cached copy, give ours back */' 'if (false) {'
}

mutant windows_unchecked
m_windows_unchecked() {
    WHAT="kvc_seqs_create accepts windows that disagree with the prefix cache's"
    KILLERS="test_seq:windows_must_agree_with_the_prefix_cache"
    sub '    for (uint32_t g = 0; pc && g < p.n_groups; g++)
        if (p.window[g] != kvc_prefix_group_window(pc, g)) return KVC_EINVAL;' ''
}

mutant caller_unref_half_released
m_caller_unref_half_released() {
    WHAT="a release refused in one group leaves the other groups released"
    KILLERS="test_seq:a_block_the_caller_unrefd_is_an_error_not_an_abort"
    sub '            while (g-- > 0) reref(s, &q->g[g], keep);' ''
}

mutant partial_block_unchecked
m_partial_block_unchecked() {
    WHAT="create does not check the multimodal inputs of the prompt's partial last block"
    KILLERS="test_seq:multimodal_inputs_are_checked_whole_at_create"
    sub 'if ((rc = hash_blocks(s, q)) || (rc = check_partial_block(s, q))) return rc;' \
        'if ((rc = hash_blocks(s, q))) return rc;'
}

mutant append_grows_late
m_append_grows_late() {
    WHAT="append grows its hash array after appending (a failure leaves the tokens appended)"
    KILLERS="test_seq:every_allocation_failure_is_all_or_nothing_and_recoverable"
    sub '    if (!rc) rc = hash_room(s, q, (committed(q) + n) / s->bs);
    if (rc) return rc;
    push_tokens(q, tokens, n);' '    if (rc) return rc;
    push_tokens(q, tokens, n);
    if ((rc = hash_room(s, q, committed(q) / s->bs))) return rc;'
}

# ---- run -----------------------------------------------------------------------------------
if [[ ${#ONLY[@]} -gt 0 ]]; then
    for n in "${ONLY[@]}"; do
        declare -F "m_$n" >/dev/null || { echo "no mutant $n" >&2; exit 2; }
    done
    MUTANTS=("${ONLY[@]}")
fi
mkdir -p "$WORK/base"
cp "$SRC/src/seq/seq.c" "$WORK/base/seq.c"
build "$WORK/base"
for t in "${TESTS[@]}"; do
    if ! run "$WORK/base" "$t"; then
        echo "the unmutated seq.c fails $t: fix that first" >&2
        cat "$WORK/base/out.$t" >&2
        exit 1
    fi
done

survived=0
start=$SECONDS
for NAME in "${MUTANTS[@]}"; do
    dir="$WORK/$NAME"
    mkdir -p "$dir"
    cp "$SRC/src/seq/seq.c" "$dir/seq.c"
    MUT_FILE="$dir/seq.c"
    WHAT="" KILLERS=""
    if ! "m_$NAME"; then
        survived=$((survived + 1))
        continue
    fi
    if cmp -s "$dir/seq.c" "$SRC/src/seq/seq.c"; then
        echo "mutant $NAME changed nothing" >&2
        survived=$((survived + 1))
        continue
    fi
    if ! build "$dir" 2>"$dir/build.log"; then
        echo "mutant $NAME does not compile:" >&2
        cat "$dir/build.log" >&2
        survived=$((survived + 1))
        continue
    fi
    caught="" missed=""
    for k in $KILLERS; do
        if run "$dir" "$k"; then missed+=" $k"; else caught+=" $k"; fi
    done
    line="$(printf '%-28s' "$NAME") $WHAT"
    if [[ -n $missed ]]; then
        echo "SURVIVED $line"
        echo "         not caught by:$missed"
        survived=$((survived + 1))
    else
        echo "caught   $line"
        echo "         by:$caught"
    fi
    if [[ $ALL == --all ]]; then
        all=""
        for t in "${TESTS[@]}"; do run "$dir" "$t" || all+=" $t"; done
        echo "         whole binaries that fail:${all:- none}"
    fi
    rm -f "$dir"/test_* "$dir"/*.o
done
echo "${#MUTANTS[@]} mutants of src/seq/seq.c, $survived survived ($((SECONDS - start)) s)"
[[ $survived == 0 ]]
