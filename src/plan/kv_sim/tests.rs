//! Paged against contiguous on small workloads with known answers, and the published bounds.

use super::*;

fn req(arrival: u64, prompt: u64, output: u64) -> Request {
    Request {
        arrival,
        prompt,
        output,
        prefix_group: None,
        prefix: 0,
    }
}

#[test]
fn one_request_alone() {
    let r = [req(0, 10, 5)];
    let paged = simulate_paged(&r, 100, 4, None);
    assert_eq!((paged.steps, paged.completed, paged.preemptions), (5, 1, 0));
    // Holds 11..15 tokens in 3..4 blocks of 4.
    assert_eq!(paged.series[0].used_tokens, 11);
    assert_eq!(paged.series[0].allocated_tokens, 12);
    let contiguous = simulate_contiguous(&r, 400, 64);
    assert_eq!(contiguous.series[0].allocated_tokens, 64);
    assert!(contiguous.utilization < paged.utilization);
}

#[test]
fn preempts_when_blocks_run_out() {
    // Two requests of 4-token prompts and 8 outputs in 4 blocks of 4: both admitted, both
    // need a third block, so the newer one is preempted and finishes later.
    let r = [req(0, 4, 8), req(0, 4, 8)];
    let paged = simulate_paged(&r, 4, 4, None);
    assert_eq!(paged.completed, 2);
    assert!(paged.preemptions >= 1);
    assert_eq!(paged.max_running, 2);
}

#[test]
fn prefix_blocks_are_shared() {
    let shared = |arrival| Request {
        arrival,
        prompt: 64,
        output: 4,
        prefix_group: Some("system".into()),
        prefix: 64,
    };
    let r = [shared(0), shared(0), shared(0)];
    let paged = simulate_paged(&r, 1000, 16, None);
    // 4 shared blocks + one own block each for the generated tokens.
    assert_eq!(paged.peak_allocated_tokens, (4 + 3) * 16);
}

#[test]
fn rejects_what_can_never_fit() {
    let r = [req(0, 1000, 1), req(5, 4, 1)];
    let paged = simulate_paged(&r, 4, 4, None);
    assert_eq!((paged.rejected, paged.completed), (1, 1));
    let contiguous = simulate_contiguous(&r, 16, 8);
    assert_eq!((contiguous.rejected, contiguous.completed), (1, 1));
}

/// Kwon et al. 2023 and the vLLM blog: paged allocation wastes only the last block of each
/// sequence, "under 4%", while pre-allocating servers keep token states in only 20.4-38.2%
/// of their KV memory (the blog: 60-80% wasted). A synthetic workload of 2048-token
/// reservations whose requests use a few hundred tokens lands in those ranges; the
/// published figures come from the paper's traces, which are not reproduced here.
#[test]
fn vllm_waste_bounds() {
    let mut state = 12345u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let requests: Vec<Request> = (0..400)
        .map(|i| req(i / 4, 100 + next(400), 100 + next(400)))
        .collect();
    let paged = simulate_paged(&requests, 4096, 16, None);
    assert!(
        1.0 - paged.utilization < 0.04,
        "paged waste {}",
        1.0 - paged.utilization
    );
    let contiguous = simulate_contiguous(&requests, 4096 * 16, 2048);
    assert!(
        (0.204..=0.382).contains(&contiguous.utilization),
        "contiguous utilisation {}",
        contiguous.utilization
    );
    assert!(paged.mean_running > contiguous.mean_running);
}

/// A cap on running sequences bounds the concurrency reached and, on a pool that preempts
/// without it, trades preemptions for waiting.
#[test]
fn max_running_caps_concurrency() {
    let r: Vec<Request> = (0..8).map(|_| req(0, 4, 8)).collect();
    let free = simulate_paged(&r, 12, 4, None);
    assert!(free.preemptions > 0);
    let capped = simulate_paged(&r, 12, 4, Some(4));
    assert_eq!(capped.max_running, 4);
    assert_eq!(capped.preemptions, 0);
    assert_eq!(capped.completed, 8);
}
