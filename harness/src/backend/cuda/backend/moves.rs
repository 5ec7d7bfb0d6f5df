//! A step's moves between memories on the `cuda` backend: lower-tier offloads and onloads
//! (queued first, see [`super::super::tier`]) and preemption swaps through pinned host memory.
//! Kept apart from the step's compute so each file has one job.

use super::*;

impl CudaBackend {
    /// Queues the step's tier ops, in order (onloads as late as it allows, as on `cpu`:
    /// [`crate::backend::cpu::late_onload_order`]), before anything else of the step (see
    /// [`super::tier`]); returns the staging buffers the queued copies read.
    pub(super) fn tier_ops(
        &mut self,
        plan: &StepPlan,
        cache: &dyn KvCacheManager,
        step: u64,
    ) -> Result<Vec<Vec<PinnedKv>>, BackendError> {
        let mut keep = Vec::new();
        if plan.tier_ops.is_empty() {
            return Ok(keep);
        }
        if cache.mode() != CacheMode::Paged {
            return Err(BackendError::Step(
                "cuda: tier ops from a contiguous cache: only the paged cache has lower tiers"
                    .into(),
            ));
        }
        let mut tiers = self.tiers.take().ok_or_else(|| {
            BackendError::Step("cuda: a tier op, but the run set up no lower tier".into())
        })?;
        let gpu = self.gpu.clone();
        let fence = self.tier_fence.clone();
        let pending: Vec<(u64, Arc<Event>)> = self
            .in_flight
            .iter()
            .filter(|f| f.output.is_none())
            .map(|f| (f.id, self.end_ev[f.ring].clone()))
            .collect();
        let mut wait = |w: Wait| -> Result<(), BackendError> {
            match w {
                Wait::Step(id) if id != step => {
                    // A step no longer in flight has completed: nothing to wait for.
                    if let Some((_, ev)) = pending.iter().find(|(i, _)| *i == id) {
                        ev.synchronize().map_err(dev)?;
                    }
                    Ok(())
                }
                _ => {
                    gpu.record(&fence).map_err(dev)?;
                    fence.synchronize().map_err(dev)
                }
            }
        };
        let mut kv = std::mem::take(&mut self.kv);
        let mut r = Ok(());
        for i in crate::backend::cpu::late_onload_order(&plan.tier_ops) {
            let op = &plan.tier_ops[i];
            r = tiers.perform(&gpu, &mut kv, op, step, &mut wait, &mut keep);
            if r.is_err() {
                break;
            }
        }
        self.kv = kv;
        self.tiers = Some(tiers);
        if let Err(e) = r {
            // Copies already queued read the staging buffers: freed only once idle.
            self.graveyard.append(&mut keep);
            return Err(e);
        }
        Ok(keep)
    }

    pub(super) fn transfer(
        &mut self,
        plan: &StepPlan,
        cache: &dyn KvCacheManager,
    ) -> Result<Vec<Vec<PinnedKv>>, BackendError> {
        let ops: Vec<(usize, usize, usize)> = plan
            .copies
            .iter()
            .map(|c| {
                (
                    c.src_slot as usize,
                    c.dst_slot as usize,
                    c.len_tokens as usize,
                )
            })
            .collect();
        let launches = copy_launches(&ops, self.num_slots, COPY_PAIRS_PER_LAUNCH).map_err(dev)?;
        let gpu = self.gpu.clone();
        let mut kv = std::mem::take(&mut self.kv);
        let r = self
            .model()
            .and_then(|m| m.copy(&gpu, &mut kv, &launches).map_err(dev));
        self.kv = kv;
        r?;
        let mut sources = Vec::new();
        let row = self.kv.first().map_or(0, |l| l.shape.kv_row());
        for s in &plan.swaps {
            let layout = cache.layout(s.seq).ok_or_else(|| {
                BackendError::Step(format!("swap of sequence {}: no layout", s.seq))
            })?;
            let runs = seq_addr(layout)
                .runs(s.tokens as usize, self.num_slots)
                .map_err(dev)?;
            match s.direction {
                SwapDirection::Out => {
                    let mut bufs = Vec::with_capacity(self.kv.len());
                    for layer in &self.kv {
                        let mut host = self
                            .gpu
                            .pinned(self.kv_dtype, 2 * s.tokens as usize * row)
                            .map_err(dev)?;
                        // All K rows in token order, then all V rows: the layout must not
                        // depend on the runs, which differ after the swap-in's allocation.
                        let v_base = s.tokens as usize * row;
                        let mut at = 0;
                        let mut queued = Ok(());
                        for &(first, len) in &runs {
                            queued = self.gpu.swap_out_kv(
                                layer,
                                first,
                                len,
                                &mut host,
                                (at, v_base + at),
                            );
                            if queued.is_err() {
                                break;
                            }
                            at += len * row;
                        }
                        bufs.push(host);
                        if let Err(e) = queued {
                            // Queued copies write into these: freed only once the device is idle.
                            self.graveyard.push(bufs);
                            self.graveyard.append(&mut sources);
                            return Err(dev(e));
                        }
                    }
                    if let Some(old) = self.host.insert(s.seq, bufs) {
                        self.graveyard.push(old);
                    }
                }
                SwapDirection::In => {
                    let bufs = self.host.remove(&s.seq).ok_or_else(|| {
                        BackendError::Step(format!(
                            "swap-in of sequence {}: nothing swapped out",
                            s.seq
                        ))
                    })?;
                    let mut queued = Ok(());
                    let v_base = s.tokens as usize * row;
                    'layers: for (layer, host) in self.kv.iter_mut().zip(&bufs) {
                        let mut at = 0;
                        for &(first, len) in &runs {
                            queued =
                                self.gpu
                                    .swap_in_kv(layer, first, len, host, (at, v_base + at));
                            if queued.is_err() {
                                break 'layers;
                            }
                            at += len * row;
                        }
                    }
                    sources.push(bufs);
                    if let Err(e) = queued {
                        // Copies already queued read these buffers: they are freed only after
                        // the device is idle (teardown synchronizes first).
                        self.graveyard.append(&mut sources);
                        return Err(dev(e));
                    }
                }
            }
        }
        Ok(sources)
    }
}
