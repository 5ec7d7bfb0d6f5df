//! Builds the host version of the CUDA programs for the emulated device (`cuda-emu`): each
//! program's text, exactly as NVRTC gets it, compiled by the system C++ compiler after
//! `emu/emu_cuda.h` (the CUDA built-ins), plus one trampoline per kernel that unpacks CUDA's
//! `kernelParams` into the real parameters. The kernel names come from the preprocessed text
//! (`__global__` turned into a marker), so a kernel added to a `.cu` file gets its trampoline
//! without any list to update.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "src/source.rs"]
mod source;

use source::ProgramId;

const MARKER: &str = "EMU_KERNEL_MARKER";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let emu_dir = manifest.join("emu");
    for p in ["emu", "cu", "src/source.rs"] {
        println!("cargo:rerun-if-changed={}", manifest.join(p).display());
    }

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .debug(false)
        .warnings(false)
        .flag("-fno-strict-aliasing")
        .flag("-Wno-unknown-pragmas")
        .include(&emu_dir)
        .file(emu_dir.join("emu_runtime.cpp"));

    // (name, program index, kernel index), sorted by name for the lookup.
    let mut all: Vec<(String, usize, usize)> = Vec::new();
    let mut registry = String::from(
        "#include \"emu_cuda.h\"\n\
         extern \"C\" const ::emu::KernelEntry* emu_table_emu_tests(std::size_t* n);\n",
    );
    for (pi, p) in ProgramId::ALL.iter().enumerate() {
        let text = host_text(&p.source());
        let names = kernel_names(&out, p.name(), &text);
        let expected = p.kernels();
        let mut sorted_names = names.clone();
        sorted_names.sort();
        let mut sorted_expected = expected.clone();
        sorted_expected.sort();
        assert_eq!(
            sorted_names,
            sorted_expected,
            "program {}: the kernels its text defines differ from source.rs's list",
            p.name()
        );
        let tu = out.join(format!("emu_{}.cpp", p.name()));
        std::fs::write(&tu, program_tu(p.name(), &text, &names)).expect("write program TU");
        build.file(&tu);
        let _ = writeln!(
            registry,
            "extern \"C\" const ::emu::KernelEntry* emu_table_{}(std::size_t* n);",
            p.name()
        );
        for (ki, n) in names.iter().enumerate() {
            all.push((n.clone(), pi, ki));
        }
    }
    // The emulator's test kernels: a program of the host build only (no NVRTC counterpart).
    let test_pi = ProgramId::ALL.len();
    let test_text = host_text(
        &std::fs::read_to_string(emu_dir.join("test_kernels.cu")).expect("test_kernels.cu"),
    );
    let test_names = kernel_names(&out, "emu_tests", &test_text);
    let tu = out.join("emu_emu_tests.cpp");
    std::fs::write(&tu, program_tu("emu_tests", &test_text, &test_names)).expect("write test TU");
    build.file(&tu);
    let mut test_all: Vec<(String, usize, usize)> = Vec::new();
    for (ki, n) in test_names.iter().enumerate() {
        test_all.push((n.clone(), test_pi, ki));
    }
    registry.push_str(
        "extern \"C\" int emu_kernels_launch(unsigned int program, unsigned int kernel,\n\
         \x20   const unsigned int* grid, const unsigned int* block, unsigned int shared,\n\
         \x20   void** params, std::size_t nparams, ::emu::LaunchResult* res) {\n\
         \x20 std::size_t n = 0;\n  const ::emu::KernelEntry* t = nullptr;\n  switch (program) {\n",
    );
    for (pi, p) in ProgramId::ALL.iter().enumerate() {
        let _ = writeln!(
            registry,
            "    case {pi}: t = emu_table_{}(&n); break;",
            p.name()
        );
    }
    let _ = writeln!(
        registry,
        "    case {test_pi}: t = emu_table_emu_tests(&n); break;"
    );
    registry.push_str(
        "    default: return ::emu::LAUNCH_UNKNOWN;\n  }\n\
         \x20 if (kernel >= n) return ::emu::LAUNCH_UNKNOWN;\n\
         \x20 return ::emu::launch_entry(&t[kernel], grid, block, shared, params, nparams, res);\n}\n",
    );
    let reg = out.join("emu_registry.cpp");
    std::fs::write(&reg, registry).expect("write registry");
    build.file(&reg);
    build.compile("kvbench_cuda_emu");

    all.sort();
    // NAMES: the kernels NVRTC programs export; KERNELS: those and the emulator's test kernels.
    let names: Vec<String> = all.iter().map(|e| e.0.clone()).collect();
    all.extend(test_all);
    all.sort();
    let mut rs = String::from("/// (kernel name, program index, kernel index), sorted by name.\n");
    let _ = writeln!(rs, "static KERNELS: [(&str, u32, u32); {}] = [", all.len());
    for (n, p, k) in &all {
        let _ = writeln!(rs, "    ({n:?}, {p}, {k}),");
    }
    rs.push_str("];\n");
    let _ = writeln!(rs, "static NAMES: [&str; {}] = [", names.len());
    for n in &names {
        let _ = writeln!(rs, "    {n:?},");
    }
    rs.push_str("];\n");
    std::fs::write(out.join("emu_kernels.rs"), rs).expect("write kernel table");
}

/// The program text for the host: `extern "C"` dropped from the kernels, which live in a
/// namespace per program (their C names would clash with other symbols of the binary).
fn host_text(source: &str) -> String {
    let text = source.replace("extern \"C\" __global__", "__global__");
    assert!(
        text.contains("__global__"),
        "a CUDA program without kernels"
    );
    text
}

/// The kernels the text defines: preprocessed with `__global__` as a marker, each marker is
/// followed by `void` and the kernel's name.
fn kernel_names(out: &Path, program: &str, text: &str) -> Vec<String> {
    let scan = out.join(format!("scan_{program}.cpp"));
    std::fs::write(
        &scan,
        format!("#define __global__ {MARKER}\n#define __launch_bounds__(...)\n{text}"),
    )
    .expect("write scan file");
    let expanded = cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(false)
        .file(&scan)
        .expand();
    let expanded = String::from_utf8_lossy(&expanded);
    let mut names = Vec::new();
    for chunk in expanded.split(MARKER).skip(1) {
        let mut words = chunk
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty());
        assert_eq!(
            words.next(),
            Some("void"),
            "a kernel not returning void in {program}"
        );
        let name = words.next().expect("kernel name");
        names.push(name.to_string());
    }
    names
}

fn program_tu(program: &str, text: &str, names: &[String]) -> String {
    let ns = format!("emu_prog_{program}");
    let mut s = format!(
        "// Generated by build.rs: program {program} for the emulated device.\n\
         #include \"emu_cuda.h\"\nnamespace {ns} {{\n#line 1 \"{program}.cu\"\n{text}\n}}  // namespace {ns}\n\
         static const ::emu::KernelEntry entries[] = {{\n"
    );
    for n in names {
        let _ = writeln!(s, "  EMU_KERNEL_ENTRY({ns}, {n}),");
    }
    let _ = writeln!(
        s,
        "}};\nextern \"C\" const ::emu::KernelEntry* emu_table_{program}(std::size_t* n) {{\n  \
         *n = sizeof entries / sizeof entries[0];\n  return entries;\n}}"
    );
    s
}
