//! Random operation strings through the `KvCacheManager` trait, mirrored on the reference model
//! and checked after every operation: invariants, accounting, fragmentation, each sequence's
//! reservation, and every position a step may still read mapped to a cell of its own table's
//! share that no other sequence or table holds, holding the tag last written there.

use std::collections::HashMap;

use super::model::{Model, Refusal};
use super::rng::SplitMix64;
use kvbench_baselines::manager::GroupedContiguous;
use kvbench_cache_api::{
    grouped, AllocError, Fault, GroupedPool, KvCacheManager, ReleaseReason, SeqLayout, StartRequest,
};

/// What a run exercised, so a sweep can show it reached the cases it is about.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reached {
    pub ops: u64,
    pub forks: u64,
    pub ring_turns: u64,
    pub refused: u64,
    pub deferred: u64,
    pub fired: u64,
}

impl std::ops::AddAssign for Reached {
    fn add_assign(&mut self, o: Reached) {
        self.ops += o.ops;
        self.forks += o.forks;
        self.ring_turns += o.ring_turns;
        self.refused += o.refused;
        self.deferred += o.deferred;
        self.fired += o.fired;
    }
}

fn tag(id: u64, pos: u32) -> u64 {
    ((id + 1) << 32) | u64::from(pos)
}

/// The cell `pos` of table `t` lives in for `id`, as the manager hands the layout out.
fn cell_of(m: &GroupedContiguous, id: u64, t: usize, pos: u32) -> Result<(u32, u32), String> {
    let Some(SeqLayout::Grouped { shapes, tables, .. }) = m.layout(id) else {
        return Err(format!("seq {id}: no grouped layout"));
    };
    grouped::cell(&shapes[t], &tables[t], u64::from(pos))
        .ok_or(format!("seq {id} table {t}: position {pos} has no cell"))
}

/// Write positions `from..to` of `id` into the model's store through the manager's layout.
fn write(
    m: &GroupedContiguous,
    model: &mut Model,
    id: u64,
    from: u32,
    to: u32,
) -> Result<(), String> {
    for t in 0..model.pool.shapes.len() {
        for pos in from..to {
            let cell = cell_of(m, id, t, pos)?;
            model.write(id, pos, cell);
        }
    }
    Ok(())
}

/// Everything the model says must hold now: the layouts first, read as a backend reads them,
/// then the manager's own invariants.
pub fn verify(m: &GroupedContiguous, model: &Model) -> Result<(), String> {
    verify_layouts(m, model)?;
    m.check_invariants().map_err(|e| format!("invariants: {e}"))
}

fn verify_layouts(m: &GroupedContiguous, model: &Model) -> Result<(), String> {
    let acc = m.accounting();
    let want = model.accounting();
    if acc != want {
        return Err(format!("accounting {acc:?}, the model says {want:?}"));
    }
    let ps = u64::from(model.pool.page_slots);
    if m.largest_free_extent() != model.largest_free_run() * ps {
        return Err(format!(
            "largest free extent {} slots, the model's largest free run is {} pages",
            m.largest_free_extent(),
            model.largest_free_run()
        ));
    }
    let mut owners: HashMap<(u32, u32), (u64, usize, u32)> = HashMap::new();
    for (&id, s) in &model.seqs {
        if m.reservation(id) != Some((s.base, s.pages)) {
            return Err(format!(
                "seq {id}: reservation {:?}, the model says {:?}",
                m.reservation(id),
                (s.base, s.pages)
            ));
        }
        if m.seq_tokens(id) != Some(s.written) || m.mapped_tokens(id) != Some(s.mapped) {
            return Err(format!(
                "seq {id}: {:?} written / {:?} mapped, the model says {} / {}",
                m.seq_tokens(id),
                m.mapped_tokens(id),
                s.written,
                s.mapped
            ));
        }
        let Some(SeqLayout::Grouped {
            page_slots,
            shapes,
            tables,
        }) = m.layout(id)
        else {
            return Err(format!("seq {id}: no grouped layout"));
        };
        if page_slots != model.pool.page_slots || shapes != model.pool.shapes.as_slice() {
            return Err(format!("seq {id}: layout of another pool"));
        }
        for (t, (shape, table)) in shapes.iter().zip(tables).enumerate() {
            let (off, len) = s.cuts[t];
            let share = s.base + off..s.base + off + len;
            if let Some(p) = table.pages.iter().find(|p| !share.contains(p)) {
                return Err(format!(
                    "seq {id} table {t}: page {p} outside its share {share:?}"
                ));
            }
            let full_to = if shape.window.is_none() { s.mapped } else { 0 };
            for pos in 0..full_to {
                cell_of(m, id, t, pos)?;
            }
            for pos in model.must_hold(shape, s.written) {
                let cell = cell_of(m, id, t, pos)?;
                if let Some(other) = owners.insert(cell, (id, t, pos)) {
                    return Err(format!(
                        "cell {cell:?} holds seq {id} table {t} position {pos} and {other:?}"
                    ));
                }
                let held = model.store[cell.0 as usize][cell.1 as usize];
                if held != s.content[pos as usize] {
                    return Err(format!(
                        "seq {id} table {t} position {pos} reads tag {held:#x} at {cell:?}, wrote {:#x}",
                        s.content[pos as usize]
                    ));
                }
            }
        }
    }
    Ok(())
}

fn refusal(e: &AllocError) -> Option<Refusal> {
    match e {
        AllocError::TooLarge { .. } => Some(Refusal::TooLarge),
        AllocError::NoSpace { .. } => Some(Refusal::NoSpace),
        _ => None,
    }
}

fn pick<T: Copy>(rng: &mut SplitMix64, items: &[T]) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        Some(items[rng.below(items.len())])
    }
}

/// One seeded run of `ops` operations over `pool`, `fault` armed from the start; `Err` says
/// which operation broke what.
pub fn run(
    seed: u64,
    pool: &GroupedPool,
    max_step: u32,
    ops: u32,
    fault: Option<Fault>,
) -> (Result<(), String>, Reached) {
    let mut m = GroupedContiguous::new(pool.clone(), max_step);
    if let Some(f) = fault {
        m.inject_fault(f);
    }
    let mut model = Model::new(pool.clone(), max_step);
    let mut reached = Reached::default();
    let mut log: Vec<String> = Vec::new();
    let mut rng = SplitMix64::new(seed);
    let mut next_id = 0u64;
    let result = (|| -> Result<(), String> {
        for _ in 0..ops {
            let step = one_op(&mut rng, &mut m, &mut model, &mut next_id, &mut reached)?;
            log.push(step);
            reached.ops += 1;
            verify(&m, &model)?;
        }
        let ids: Vec<u64> = model.seqs.keys().copied().collect();
        for id in ids {
            m.release(id, ReleaseReason::Finish)
                .map_err(|e| format!("final release {id}: {e}"))?;
            model.release(id);
        }
        let steps: Vec<u64> = model.in_flight.iter().copied().collect();
        for s in steps {
            m.retire_step(s);
            model.retire(s);
        }
        verify(&m, &model)?;
        m.assert_quiescent().map_err(|e| format!("quiescence: {e}"))
    })();
    reached.fired = m.fault_fired();
    let result = result.map_err(|e| {
        let tail = log.len().saturating_sub(6);
        format!("{e}\n  after ops: {}", log[tail..].join(" | "))
    });
    (result, reached)
}

fn one_op(
    rng: &mut SplitMix64,
    m: &mut GroupedContiguous,
    model: &mut Model,
    next_id: &mut u64,
    reached: &mut Reached,
) -> Result<String, String> {
    let ids: Vec<u64> = model.seqs.keys().copied().collect();
    let filled: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| model.seqs[id].written == model.seqs[id].mapped)
        .collect();
    let unfilled: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| model.seqs[id].written < model.seqs[id].mapped)
        .collect();
    let roll = rng.between(0, 99);
    if roll < 16 {
        let id = *next_id;
        *next_id += 1;
        let prompt = rng.between(1, 30);
        let reserve = rng.between(1, 48);
        let tokens = vec![7u32; prompt as usize];
        let req = StartRequest {
            seq: id,
            tokens: &tokens,
            scope: None,
            reserve_tokens: reserve,
        };
        let probe = m.probe_start(&req);
        let want = model.place(reserve.max(prompt));
        if probe.fits != want.is_ok() {
            return Err(format!(
                "start {id}: probe fits {}, model {want:?}",
                probe.fits
            ));
        }
        if probe.new_slots != model.reservation_slots(reserve.max(prompt)) {
            return Err(format!("start {id}: probe takes {} slots", probe.new_slots));
        }
        let got = m.start(&req);
        let want = model.start(id, prompt, reserve);
        match (&got, want) {
            (Ok(_), Ok(_)) => {}
            (Err(e), Err(r)) if refusal(e) == Some(r) => reached.refused += 1,
            _ => return Err(format!("start {id}: manager {got:?}, model {want:?}")),
        }
        return Ok(format!("start {id} p{prompt} r{reserve}"));
    }
    if roll < 36 {
        let Some(id) = pick(rng, &unfilled) else {
            return Ok("-".into());
        };
        let budget = model.write_budget(id);
        if budget == 0 {
            return Ok("-".into());
        }
        let s = &model.seqs[&id];
        let n = rng.between(1, (s.mapped - s.written).min(budget));
        let from = s.written;
        model.note_write(id);
        m.fill(id, n).map_err(|e| format!("fill {id} {n}: {e}"))?;
        let s = model.seqs.get_mut(&id).expect("picked live");
        s.written += n;
        s.content.extend((from..from + n).map(|p| tag(id, p)));
        count_turns(model, id, from, from + n, reached);
        write(m, model, id, from, from + n)?;
        return Ok(format!("fill {id} {n}"));
    }
    if roll < 58 {
        let Some(id) = pick(rng, &filled) else {
            return Ok("-".into());
        };
        if model.write_budget(id) == 0 {
            return Ok("-".into());
        }
        let s = &model.seqs[&id];
        let got = m.append(id);
        if s.mapped >= s.reserve {
            return match got {
                Err(AllocError::NoSpace { .. }) => {
                    reached.refused += 1;
                    Ok(format!("append {id} refused"))
                }
                other => Err(format!("append {id} past its reservation: {other:?}")),
            };
        }
        let copies = got.map_err(|e| format!("append {id}: {e}"))?;
        if !copies.is_empty() {
            return Err(format!("append {id} copied {copies:?}"));
        }
        model.note_write(id);
        let s = model.seqs.get_mut(&id).expect("picked live");
        let pos = s.written;
        s.mapped += 1;
        s.written += 1;
        s.content.push(tag(id, pos));
        count_turns(model, id, pos, pos + 1, reached);
        write(m, model, id, pos, pos + 1)?;
        return Ok(format!("append {id}"));
    }
    if roll < 64 {
        let Some(parent) = pick(rng, &filled) else {
            return Ok("-".into());
        };
        let child = *next_id;
        *next_id += 1;
        let got = m.fork(parent, child);
        let want = model.fork(parent, child);
        match (got, want) {
            (Ok(ops), Ok(_)) => {
                for op in &ops {
                    model.copy(op)?;
                }
                reached.forks += 1;
            }
            (Err(e), Err(r)) if refusal(&e) == Some(r) => reached.refused += 1,
            (got, want) => {
                return Err(format!(
                    "fork {parent}->{child}: manager {got:?}, model {want:?}"
                ))
            }
        }
        return Ok(format!("fork {parent}->{child}"));
    }
    if roll < 70 {
        let Some(id) = pick(rng, &ids) else {
            return Ok("-".into());
        };
        if !model.in_flight.is_empty() {
            reached.deferred += 1;
        }
        m.release(id, ReleaseReason::Finish)
            .map_err(|e| format!("release {id}: {e}"))?;
        model.release(id);
        return Ok(format!("release {id}"));
    }
    if roll < 85 {
        if model.in_flight.len() >= 3 {
            return Ok("-".into());
        }
        let (a, b) = (m.begin_step(), model.begin());
        if a != b {
            return Err(format!("begin_step gave {a}, the model {b}"));
        }
        return Ok(format!("begin {a}"));
    }
    let steps: Vec<u64> = model.in_flight.iter().copied().collect();
    let Some(step) = pick(rng, &steps) else {
        return Ok("-".into());
    };
    m.retire_step(step);
    model.retire(step);
    Ok(format!("retire {step}"))
}

/// Count the sliding tables whose ring wrapped onto a page it used before in `from..to`.
fn count_turns(model: &Model, id: u64, from: u32, to: u32, reached: &mut Reached) {
    let s = &model.seqs[&id];
    for (shape, &(_, pages)) in model.pool.shapes.iter().zip(&s.cuts) {
        if shape.window.is_some() && pages > 0 {
            let cap = pages * shape.block_tokens;
            if to > cap && (from..to).any(|p| p >= cap && p % shape.block_tokens == 0) {
                reached.ring_turns += 1;
            }
        }
    }
}
