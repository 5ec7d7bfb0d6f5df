//! One GPU: context, stream, the programs compiled for its architecture, and typed launches of
//! every kernel. Opening it is the only place the driver is touched; every failure is a
//! [`CudaError`]. Launches take device buffers whose indices the caller checked on the host
//! ([`crate::launch`]); the kernels themselves do no bounds checks.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::error::CudaError;
use crate::launch::{log2_block_size, AttnShape, Partitions, ATTN_THREADS};
use crate::libs::{guarded, CudaLib};
use crate::nvrtc;
use crate::source::{attn_kernel_name, kv_write_kernel_name, KvDtype, ProgramId};

/// What the driver says about device 0.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: usize,
    pub l2_bytes: usize,
    pub total_mem_bytes: usize,
    /// `cuDriverGetVersion`: 13000 = 13.0.
    pub driver_version: i32,
}

impl GpuInfo {
    /// The NVRTC architecture for this device (`sm_90`).
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// The installed driver's CUDA version (`cuDriverGetVersion`), without touching any device.
pub fn driver_version() -> Result<i32, CudaError> {
    guarded(CudaLib::Driver, || {
        let mut v = 0;
        // SAFETY: a valid out-pointer; cuDriverGetVersion needs no cuInit.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map(|()| v)
            .map_err(CudaError::driver("cuDriverGetVersion"))
    })?
}

fn context(ordinal: usize) -> Result<(Arc<CudaContext>, GpuInfo), CudaError> {
    guarded(CudaLib::Driver, || -> Result<_, CudaError> {
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice(format!("{e:?}")))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(CudaError::driver("cuDeviceGetAttribute"))
        };
        let info = GpuInfo {
            name: ctx.name().map_err(CudaError::driver("cuDeviceGetName"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(CudaError::driver("compute capability"))?,
            sm_count: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                as usize,
            l2_bytes: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            total_mem_bytes: ctx
                .total_mem()
                .map_err(CudaError::driver("cuDeviceTotalMem"))?,
            driver_version: driver_version()?,
        };
        Ok((ctx, info))
    })?
}

/// Device 0's description, or why there is none.
pub fn probe() -> Result<GpuInfo, CudaError> {
    context(0).map(|(_, info)| info)
}

/// K and V of one layer on the device, `[num_slots, kv_heads, head_dim]` each.
pub enum KvBuf {
    F32(CudaSlice<f32>),
    /// bf16 bits.
    Bf16(CudaSlice<u16>),
}

impl KvBuf {
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvBuf::F32(_) => KvDtype::F32,
            KvBuf::Bf16(_) => KvDtype::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(s) => s.len(),
            KvBuf::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct DevLayer {
    pub k: KvBuf,
    pub v: KvBuf,
    pub num_slots: usize,
    pub shape: AttnShape,
}

/// Where rows find their tokens.
pub enum Addressing<'a> {
    /// `block_tables` is `[num_seqs, max_blocks]`.
    Paged {
        block_tables: &'a CudaSlice<i32>,
        max_blocks: usize,
        block_size: usize,
    },
    /// Sequence `s` holds positions at slots `seq_base[s] ..`.
    Contiguous { seq_base: &'a CudaSlice<i64> },
}

/// The query rows of one attention launch: row `r` attends positions `[0, row_len[r])` of
/// sequence `row_seq[r]`.
pub struct Rows<'a> {
    pub row_seq: &'a CudaSlice<i32>,
    pub row_len: &'a CudaSlice<i32>,
    pub rows: usize,
    pub max_len: usize,
}

/// Partition scratch for the log-sum-exp merge, grown on demand.
#[derive(Default)]
pub struct Workspace {
    part_out: Option<CudaSlice<f32>>,
    part_max: Option<CudaSlice<f32>>,
    part_sum: Option<CudaSlice<f32>>,
}

impl Workspace {
    /// Allocates the partition scratch for `row_parts` (row, partition) pairs of `shape` now,
    /// so that no launch within that bound allocates (the device's free memory stays flat).
    pub fn reserve(
        &mut self,
        gpu: &Gpu,
        shape: AttnShape,
        row_parts: usize,
    ) -> Result<(), CudaError> {
        let m = row_parts * shape.q_heads;
        grow(gpu, &mut self.part_out, m * shape.head_dim)?;
        grow(gpu, &mut self.part_max, m)?;
        grow(gpu, &mut self.part_sum, m)
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        [&self.part_out, &self.part_max, &self.part_sum]
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| s.len() * 4))
            .sum()
    }
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: GpuInfo,
    functions: HashMap<String, CudaFunction>,
    dummy_i32: CudaSlice<i32>,
    dummy_i64: CudaSlice<i64>,
    dummy_f32: CudaSlice<f32>,
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A one-dimensional grid of `n` blocks (checked against the device's x limit).
fn u32_of(n: usize, what: &str) -> Result<u32, CudaError> {
    crate::launch::grid(n, 1, 1, what).map(|g| g.0)
}

fn i32_of(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("{what} {n} exceeds i32")))
}

impl Gpu {
    /// Opens device 0 and compiles every program for its architecture.
    pub fn open() -> Result<Gpu, CudaError> {
        let (ctx, info) = context(0)?;
        let arch = info.arch();
        let mut functions = HashMap::new();
        // The three programs compile in parallel (NVRTC is thread-safe; ~10 s each alone).
        let compiled: Vec<Result<nvrtc::Compiled, nvrtc::CompileError>> = std::thread::scope(|s| {
            let hs: Vec<_> = ProgramId::ALL
                .iter()
                .map(|&p| {
                    let arch = &arch;
                    s.spawn(move || nvrtc::compile(p, arch))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(nvrtc::CompileError::Lib(crate::LibError::Panicked {
                            lib: CudaLib::Nvrtc,
                            message: "compile thread panicked".into(),
                        }))
                    })
                })
                .collect()
        });
        for (p, compiled) in ProgramId::ALL.into_iter().zip(compiled) {
            let compiled = compiled?;
            let module: Arc<CudaModule> = guarded(CudaLib::Driver, || {
                ctx.load_module(Ptx::from_binary(compiled.cubin.clone()))
            })?
            .map_err(CudaError::driver("cuModuleLoadData"))?;
            for k in p.kernels() {
                let f = module
                    .load_function(&k)
                    .map_err(CudaError::driver("cuModuleGetFunction"))?;
                functions.insert(k, f);
            }
        }
        // One stream, in order: the safe API's per-buffer event tracking is for multi-stream
        // use and would add an event per launch argument. Not the legacy default stream: CUDA
        // graphs cannot capture it.
        // SAFETY: nothing has been allocated on this context yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(CudaError::driver("cuStreamCreate"))?;
        let dummy_i32 = stream
            .alloc_zeros::<i32>(1)
            .map_err(CudaError::driver("alloc"))?;
        let dummy_i64 = stream
            .alloc_zeros::<i64>(1)
            .map_err(CudaError::driver("alloc"))?;
        let dummy_f32 = stream
            .alloc_zeros::<f32>(1)
            .map_err(CudaError::driver("alloc"))?;
        Ok(Gpu {
            ctx,
            stream,
            info,
            functions,
            dummy_i32,
            dummy_i64,
            dummy_f32,
        })
    }

    /// A loaded kernel by name (the model's launchers in [`crate::model`] use it).
    pub(crate) fn kernel(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.function(name)
    }

    /// `cuMemGetInfo`: (free, total) bytes of this device.
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        guarded(CudaLib::Driver, || self.ctx.mem_get_info())?
            .map(|(f, t)| (f as u64, t as u64))
            .map_err(CudaError::driver("cuMemGetInfo"))
    }

    /// Waits for the stream, then hands the default memory pool's unused memory back to the
    /// device. cudarc allocates from that pool (`cuMemAllocAsync`) wherever the device has
    /// pools; a freed buffer returns to the pool, and only this makes `cuMemGetInfo` see it.
    pub fn release_freed(&self) -> Result<(), CudaError> {
        self.sync()?;
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        guarded(CudaLib::Driver, || {
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: a valid out-pointer and this context's device.
            unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
                .result()
                .map_err(CudaError::driver("cuDeviceGetDefaultMemPool"))?;
            // SAFETY: `pool` is the device's default pool; trimming frees only unused memory.
            unsafe { sys::cuMemPoolTrimTo(pool, 0) }
                .result()
                .map_err(CudaError::driver("cuMemPoolTrimTo"))
        })?
    }

    fn function(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions
            .get(name)
            .ok_or_else(|| CudaError::Shape(format!("no kernel {name} loaded")))
    }

    pub fn upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>, CudaError> {
        if host.is_empty() {
            // cudarc cannot allocate zero elements; kernels never read these.
            return self.zeros(1);
        }
        self.stream
            .clone_htod(host)
            .map_err(CudaError::driver("cuMemcpyHtoD"))
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(CudaError::driver("cuMemAlloc"))
    }

    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
    ) -> Result<Vec<T>, CudaError> {
        self.stream
            .clone_dtoh(dev)
            .map_err(CudaError::driver("cuMemcpyDtoH"))
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))
    }

    /// A layer of `num_slots` slots, every byte NaN (a slot nobody wrote poisons what reads it).
    pub fn new_layer(
        &self,
        dtype: KvDtype,
        num_slots: usize,
        shape: AttnShape,
    ) -> Result<DevLayer, CudaError> {
        shape.check()?;
        let n = num_slots * shape.kv_row();
        let mut layer = match dtype {
            KvDtype::F32 => DevLayer {
                k: KvBuf::F32(self.zeros(n)?),
                v: KvBuf::F32(self.zeros(n)?),
                num_slots,
                shape,
            },
            KvDtype::Bf16 => DevLayer {
                k: KvBuf::Bf16(self.zeros(n)?),
                v: KvBuf::Bf16(self.zeros(n)?),
                num_slots,
                shape,
            },
        };
        let nan_word = 0x7fc0_7fc0u32; // two bf16 NaNs, or one f32 NaN
        let words = n * dtype.bytes() / 4;
        for buf in [&mut layer.k, &mut layer.v] {
            match buf {
                KvBuf::F32(s) => self.fill_words(s, words, nan_word)?,
                KvBuf::Bf16(s) => self.fill_words(s, words, nan_word)?,
            }
        }
        Ok(layer)
    }

    /// Fills the first `words` 32-bit words of `buf` with `word`.
    pub fn fill_words<T>(
        &self,
        buf: &mut CudaSlice<T>,
        words: usize,
        word: u32,
    ) -> Result<(), CudaError> {
        if words * 4 > buf.len() * std::mem::size_of::<T>() {
            return Err(CudaError::Shape("fill past the end of a buffer".into()));
        }
        let f = self.function("fill_words")?;
        let n = words as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(buf).arg(&n).arg(&word);
        // SAFETY: fill_words(u32*, i64, u32) writes the first `words` words, checked above.
        unsafe { b.launch(cfg((1024, 1, 1), 256)) }.map_err(CudaError::driver("fill_words"))?;
        Ok(())
    }

    /// Writes `n` tokens' K/V (`[n, kv_row]` f32 each) into `slots` (negative = skip).
    pub fn write_kv(
        &self,
        layer: &mut DevLayer,
        k_new: &CudaSlice<f32>,
        v_new: &CudaSlice<f32>,
        slots: &CudaSlice<i64>,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let row = layer.shape.kv_row();
        if k_new.len() < n * row || v_new.len() < n * row || slots.len() < n {
            return Err(CudaError::Shape(
                "write_kv: input shorter than n rows".into(),
            ));
        }
        let f = self.function(kv_write_kernel_name(layer.k.dtype()))?;
        let row_i = i32_of(row, "row")?;
        let mut b = self.stream.launch_builder(f);
        match (&mut layer.k, &mut layer.v) {
            (KvBuf::F32(k), KvBuf::F32(v)) => b.arg(k).arg(v),
            (KvBuf::Bf16(k), KvBuf::Bf16(v)) => b.arg(k).arg(v),
            _ => return Err(CudaError::Shape("K and V of different types".into())),
        };
        b.arg(k_new).arg(v_new).arg(slots).arg(&row_i);
        // SAFETY: the caller checked every slot against num_slots (launch::check_slots).
        unsafe { b.launch(cfg((u32_of(n, "tokens")?, 1, 1), 128)) }
            .map_err(CudaError::driver("kv_write"))?;
        Ok(())
    }

    /// Copies slot rows `pairs[2i] -> pairs[2i+1]` of K and V (checked by
    /// [`crate::launch::check_copy_pairs`]).
    pub fn copy_slots(
        &self,
        layer: &mut DevLayer,
        pairs: &CudaSlice<i64>,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let row_words = i32_of(layer.shape.kv_row() * layer.k.dtype().bytes() / 4, "row")?;
        let f = self.function("copy_slots")?;
        let mut b = self.stream.launch_builder(f);
        match (&mut layer.k, &mut layer.v) {
            (KvBuf::F32(k), KvBuf::F32(v)) => b.arg(k).arg(v),
            (KvBuf::Bf16(k), KvBuf::Bf16(v)) => b.arg(k).arg(v),
            _ => return Err(CudaError::Shape("K and V of different types".into())),
        };
        b.arg(pairs).arg(&row_words);
        // SAFETY: pairs checked against num_slots and for overlaps on the host.
        unsafe { b.launch(cfg((u32_of(n, "copies")?, 1, 1), 128)) }
            .map_err(CudaError::driver("copy_slots"))?;
        Ok(())
    }

    /// Attention for `rows`; `q` and `out` are `[rows, q_heads, head_dim]` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        layer: &DevLayer,
        addr: &Addressing<'_>,
        rows: &Rows<'_>,
        q: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        parts: Partitions,
        ws: &mut Workspace,
        scale: f32,
    ) -> Result<(), CudaError> {
        let shape = layer.shape;
        shape.check()?;
        if rows.rows == 0 {
            return Ok(());
        }
        let q_elems = rows.rows * shape.q_row();
        if q.len() < q_elems || out.len() < q_elems {
            return Err(CudaError::Shape(
                "attention: q/out shorter than rows".into(),
            ));
        }
        if (parts.part_tokens as usize) * (parts.parts as usize) < rows.max_len {
            return Err(CudaError::Shape(
                "attention: partitions do not cover max_len".into(),
            ));
        }
        let (paged, tables, max_blocks, log2_bs, base) = match addr {
            Addressing::Paged {
                block_tables,
                max_blocks,
                block_size,
            } => (
                true,
                *block_tables,
                i32_of(*max_blocks, "max_blocks")?,
                log2_block_size(*block_size)? as i32,
                &self.dummy_i64,
            ),
            Addressing::Contiguous { seq_base } => (false, &self.dummy_i32, 0, 0, *seq_base),
        };
        let name = attn_kernel_name(paged, layer.k.dtype(), shape.head_dim, shape.group());
        let f = self.function(&name)?;
        let split = parts.parts > 1;
        if split {
            let n = q_elems * parts.parts as usize;
            let m = rows.rows * shape.q_heads * parts.parts as usize;
            grow(self, &mut ws.part_out, n)?;
            grow(self, &mut ws.part_max, m)?;
            grow(self, &mut ws.part_sum, m)?;
        }
        let kv_heads = i32_of(shape.kv_heads, "kv_heads")?;
        let part_tokens = parts.part_tokens as i32;
        {
            let (po, pm, ps) = if split {
                (
                    ws.part_out.as_ref().unwrap_or(&self.dummy_f32),
                    ws.part_max.as_ref().unwrap_or(&self.dummy_f32),
                    ws.part_sum.as_ref().unwrap_or(&self.dummy_f32),
                )
            } else {
                (&self.dummy_f32, &self.dummy_f32, &self.dummy_f32)
            };
            let mut b = self.stream.launch_builder(f);
            b.arg(&mut *out).arg(po).arg(pm).arg(ps).arg(q);
            match (&layer.k, &layer.v) {
                (KvBuf::F32(k), KvBuf::F32(v)) => b.arg(k).arg(v),
                (KvBuf::Bf16(k), KvBuf::Bf16(v)) => b.arg(k).arg(v),
                _ => return Err(CudaError::Shape("K and V of different types".into())),
            };
            b.arg(rows.row_seq)
                .arg(rows.row_len)
                .arg(tables)
                .arg(&max_blocks)
                .arg(&log2_bs)
                .arg(base)
                .arg(&kv_heads)
                .arg(&part_tokens)
                .arg(&scale);
            let grid = crate::launch::grid(
                shape.kv_heads,
                rows.rows,
                parts.parts as usize,
                "kv_heads, rows, partitions",
            )?;
            // SAFETY: the caller checked tables/bases/lengths against the layer on the host;
            // buffers hold rows x heads x partitions as the kernel indexes them.
            unsafe { b.launch(cfg(grid, ATTN_THREADS)) }.map_err(CudaError::driver("attention"))?;
        }
        if split {
            let f = self.function("attn_merge")?;
            let nparts = parts.parts as i32;
            let d = i32_of(shape.head_dim, "head_dim")?;
            let mut b = self.stream.launch_builder(f);
            b.arg(out)
                .arg(ws.part_out.as_ref().unwrap_or(&self.dummy_f32))
                .arg(ws.part_max.as_ref().unwrap_or(&self.dummy_f32))
                .arg(ws.part_sum.as_ref().unwrap_or(&self.dummy_f32))
                .arg(rows.row_len)
                .arg(&nparts)
                .arg(&part_tokens)
                .arg(&d);
            let grid = crate::launch::grid(shape.q_heads, rows.rows, 1, "q_heads, rows, 1")?;
            // SAFETY: the partial buffers were sized for rows x q_heads x parts above.
            unsafe { b.launch(cfg(grid, shape.head_dim as u32)) }
                .map_err(CudaError::driver("attn_merge"))?;
        }
        Ok(())
    }

    /// The read-bandwidth ceiling kernel over `buf` (whole 16-byte vectors); `out` holds one
    /// word per block.
    pub fn read_ceiling(
        &self,
        buf: &CudaSlice<u32>,
        out: &mut CudaSlice<u32>,
    ) -> Result<(), CudaError> {
        let f = self.function("read_ceiling")?;
        let n_vec = (buf.len() / 4) as i64;
        let blocks = out.len().min(65535) as u32;
        let mut b = self.stream.launch_builder(f);
        b.arg(buf).arg(&n_vec).arg(out);
        // SAFETY: reads n_vec whole vectors of buf; writes out[0..blocks].
        unsafe { b.launch(cfg((blocks, 1, 1), 512)) }.map_err(CudaError::driver("read_ceiling"))?;
        Ok(())
    }
}

/// Host memory a layer's slots are swapped to: page-locked, so copies run at link speed.
/// Layout: K rows of the range, then V rows (as the CPU backend's `read_slots`).
pub enum PinnedKv {
    F32(PinnedHostSlice<f32>),
    Bf16(PinnedHostSlice<u16>),
}

impl Gpu {
    /// Page-locked host memory for `slots` slots of one layer.
    pub fn pinned_for(&self, layer: &DevLayer, slots: usize) -> Result<PinnedKv, CudaError> {
        let n = (2 * slots * layer.shape.kv_row()).max(1);
        // SAFETY: the contents are written by swap_out before any read (the checks poison
        // and compare them).
        Ok(match layer.k.dtype() {
            KvDtype::F32 => PinnedKv::F32(
                unsafe { self.ctx.alloc_pinned_with_flags::<f32>(n, 0) }
                    .map_err(CudaError::driver("cuMemHostAlloc"))?,
            ),
            KvDtype::Bf16 => PinnedKv::Bf16(
                unsafe { self.ctx.alloc_pinned_with_flags::<u16>(n, 0) }
                    .map_err(CudaError::driver("cuMemHostAlloc"))?,
            ),
        })
    }

    /// Copies slots `[first, first + len)` of K and V to `host` (swap out).
    pub fn swap_out(
        &self,
        layer: &DevLayer,
        first: usize,
        len: usize,
        host: &mut PinnedKv,
    ) -> Result<(), CudaError> {
        self.swap_out_at(layer, first, len, host, 0)
    }

    /// Like [`swap_out`](Self::swap_out), writing at element `at` of `host`: K rows at
    /// `at ..`, then V rows (so one buffer holds a sequence's runs one after another).
    pub fn swap_out_at(
        &self,
        layer: &DevLayer,
        first: usize,
        len: usize,
        host: &mut PinnedKv,
        at: usize,
    ) -> Result<(), CudaError> {
        let (a, n) = swap_range(layer, first, len)?;
        match (&layer.k, &layer.v, host) {
            (KvBuf::F32(k), KvBuf::F32(v), PinnedKv::F32(h)) => self.d2h(k, v, a, n, h, at),
            (KvBuf::Bf16(k), KvBuf::Bf16(v), PinnedKv::Bf16(h)) => self.d2h(k, v, a, n, h, at),
            _ => Err(CudaError::Shape(
                "swap buffer of another element type".into(),
            )),
        }
    }

    /// Copies what [`swap_out`](Self::swap_out) stored back into slots `[first, first + len)`.
    pub fn swap_in(
        &self,
        layer: &mut DevLayer,
        first: usize,
        len: usize,
        host: &PinnedKv,
    ) -> Result<(), CudaError> {
        self.swap_in_at(layer, first, len, host, 0)
    }

    /// Like [`swap_in`](Self::swap_in), reading at element `at` of `host`.
    pub fn swap_in_at(
        &self,
        layer: &mut DevLayer,
        first: usize,
        len: usize,
        host: &PinnedKv,
        at: usize,
    ) -> Result<(), CudaError> {
        let (a, n) = swap_range(layer, first, len)?;
        match (&mut layer.k, &mut layer.v, host) {
            (KvBuf::F32(k), KvBuf::F32(v), PinnedKv::F32(h)) => self.h2d(k, v, a, n, h, at),
            (KvBuf::Bf16(k), KvBuf::Bf16(v), PinnedKv::Bf16(h)) => self.h2d(k, v, a, n, h, at),
            _ => Err(CudaError::Shape(
                "swap buffer of another element type".into(),
            )),
        }
    }

    /// Page-locked host memory for `elems` elements of `dtype` (a whole sequence's swap).
    pub fn pinned(&self, dtype: KvDtype, elems: usize) -> Result<PinnedKv, CudaError> {
        let n = elems.max(1);
        // SAFETY: the contents are written by swap_out before any read.
        Ok(match dtype {
            KvDtype::F32 => PinnedKv::F32(
                unsafe { self.ctx.alloc_pinned_with_flags::<f32>(n, 0) }
                    .map_err(CudaError::driver("cuMemHostAlloc"))?,
            ),
            KvDtype::Bf16 => PinnedKv::Bf16(
                unsafe { self.ctx.alloc_pinned_with_flags::<u16>(n, 0) }
                    .map_err(CudaError::driver("cuMemHostAlloc"))?,
            ),
        })
    }

    fn d2h<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        a: usize,
        n: usize,
        h: &mut PinnedHostSlice<T>,
        at: usize,
    ) -> Result<(), CudaError> {
        if h.len() < at + 2 * n {
            return Err(CudaError::Shape("swap buffer too small".into()));
        }
        let dst = h.as_mut_slice().map_err(CudaError::driver("pinned"))?;
        let (dk, dv) = dst[at..at + 2 * n].split_at_mut(n);
        self.stream
            .memcpy_dtoh(&k.slice(a..a + n), dk)
            .map_err(CudaError::driver("cuMemcpyDtoH"))?;
        self.stream
            .memcpy_dtoh(&v.slice(a..a + n), dv)
            .map_err(CudaError::driver("cuMemcpyDtoH"))?;
        Ok(())
    }

    fn h2d<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        k: &mut CudaSlice<T>,
        v: &mut CudaSlice<T>,
        a: usize,
        n: usize,
        h: &PinnedHostSlice<T>,
        at: usize,
    ) -> Result<(), CudaError> {
        if h.len() < at + 2 * n {
            return Err(CudaError::Shape("swap buffer too small".into()));
        }
        let src = h.as_slice().map_err(CudaError::driver("pinned"))?;
        self.stream
            .memcpy_htod(&src[at..at + n], &mut k.slice_mut(a..a + n))
            .map_err(CudaError::driver("cuMemcpyHtoD"))?;
        self.stream
            .memcpy_htod(&src[at + n..at + 2 * n], &mut v.slice_mut(a..a + n))
            .map_err(CudaError::driver("cuMemcpyHtoD"))?;
        Ok(())
    }
}

/// Element range of slots `[first, first + len)`, checked against the layer.
fn swap_range(layer: &DevLayer, first: usize, len: usize) -> Result<(usize, usize), CudaError> {
    match first.checked_add(len) {
        Some(end) if end <= layer.num_slots => {
            let row = layer.shape.kv_row();
            Ok((first * row, len * row))
        }
        _ => Err(CudaError::Shape(format!(
            "swap of slots {first}+{len} past the cache ({} slots)",
            layer.num_slots
        ))),
    }
}

fn grow(gpu: &Gpu, slot: &mut Option<CudaSlice<f32>>, n: usize) -> Result<(), CudaError> {
    if slot.as_ref().is_none_or(|s| s.len() < n) {
        *slot = Some(gpu.zeros(n)?);
    }
    Ok(())
}
