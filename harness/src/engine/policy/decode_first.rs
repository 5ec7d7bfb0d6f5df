//! Decode-first with chunked prefill (Sarathi-Serve, vLLM v1): every running sequence gets its
//! next token first, so inter-token gaps stay short; the rest of the step's token budget goes to
//! prompt chunks — started prefills first, then swap-ins, then new admissions.

use super::{Policy, StepOps};

#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeFirst;

impl Policy for DecodeFirst {
    fn name(&self) -> &'static str {
        "decode_first"
    }

    fn build(&mut self, ops: &mut dyn StepOps) {
        ops.schedule_decodes();
        ops.schedule_prefills(true);
        if ops.preempted() {
            return;
        }
        ops.swap_in();
        while ops.admit(true) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::policy::fake::Fake;

    #[test]
    fn decodes_come_first_then_chunks_then_swap_ins_then_admissions_until_refused() {
        let mut f = Fake {
            admissible: 2,
            ..Fake::default()
        };
        DecodeFirst.build(&mut f);
        assert_eq!(
            f.calls,
            [
                "decodes",
                "prefills(chunked=true)",
                "swap_in",
                "admit(chunked=true)",
                "admit(chunked=true)",
                "admit(chunked=true)"
            ]
        );
    }

    #[test]
    fn no_admissions_in_a_step_that_preempted() {
        let mut f = Fake {
            admissible: 5,
            preempts: true,
            ..Fake::default()
        };
        DecodeFirst.build(&mut f);
        assert_eq!(f.calls, ["decodes", "prefills(chunked=true)"]);
        assert_eq!(f.admissible, 5);
    }
}
