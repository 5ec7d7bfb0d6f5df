//! Prefill-first (Orca-style iteration scheduling as in vLLM v0): when prompts are waiting, a
//! step runs whole prompts only and decodes wait; otherwise a step runs decodes. Time to first
//! token is short, inter-token gaps spike whenever a prompt arrives — the trade-off the
//! decode-first policy exists to avoid.

use super::{Policy, StepOps};

#[derive(Debug, Clone, Copy, Default)]
pub struct PrefillFirst;

impl Policy for PrefillFirst {
    fn name(&self) -> &'static str {
        "prefill_first"
    }

    fn build(&mut self, ops: &mut dyn StepOps) {
        if ops.has_prefill_work() {
            let mut scheduled = ops.schedule_prefills(false) > 0;
            while ops.admit(false) {
                scheduled = true;
            }
            if scheduled {
                return;
            }
        }
        ops.schedule_decodes();
        if !ops.preempted() {
            ops.swap_in();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::policy::fake::Fake;

    #[test]
    fn waiting_prompts_run_whole_and_decodes_wait() {
        let mut f = Fake {
            prefill_work: true,
            admissible: 1,
            decodes: 3,
            ..Fake::default()
        };
        PrefillFirst.build(&mut f);
        assert_eq!(
            f.calls,
            [
                "prefills(chunked=false)",
                "admit(chunked=false)",
                "admit(chunked=false)"
            ]
        );
    }

    #[test]
    fn decodes_run_when_no_prompt_can_be_scheduled() {
        let mut f = Fake {
            prefill_work: true,
            admissible: 0,
            ..Fake::default()
        };
        PrefillFirst.build(&mut f);
        assert_eq!(
            f.calls,
            [
                "prefills(chunked=false)",
                "admit(chunked=false)",
                "decodes",
                "swap_in"
            ]
        );
    }

    #[test]
    fn without_prompts_a_step_is_all_decodes() {
        let mut f = Fake {
            decodes: 4,
            ..Fake::default()
        };
        PrefillFirst.build(&mut f);
        assert_eq!(f.calls, ["decodes", "swap_in"]);
    }
}
