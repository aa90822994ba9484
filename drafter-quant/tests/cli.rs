//! The `dspark quantize-drafter` glue (`dspark::quantize_drafter`, through the dspark library):
//! argument parsing, defaults, and a run end to end.

mod common;

use clap::Parser;
use common::*;
use dspark::quantize_drafter;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: quantize_drafter::Args,
}

fn parse(argv: &[&str]) -> Result<quantize_drafter::Args, clap::Error> {
    Cli::try_parse_from(std::iter::once("quantize-drafter").chain(argv.iter().copied())).map(|c| c.args)
}

#[test]
fn parses_defaults_and_rejects_conflicting_smoke_flags() {
    let a = parse(&["--src", "d"]).unwrap();
    assert_eq!((a.bits, a.group_size, a.force, a.no_smoke, a.out, a.smoke_target), (4, 64, false, false, None, None));
    let a = parse(&["--src", "d", "--out", "o", "--bits", "8", "--group-size", "32", "--force", "--no-smoke"]).unwrap();
    assert_eq!((a.bits, a.group_size, a.force, a.no_smoke), (8, 32, true, true));
    assert!(parse(&["--src", "d", "--no-smoke", "--smoke-target", "t"]).is_err());
    assert!(parse(&[]).is_err(), "--src is required");
}

#[test]
fn runs_end_to_end_with_the_default_output_dir() {
    let s = Scratch::create("cli");
    let src = write_dspark(&s.join("drafter"), dspark_config(64));
    let args = parse(&["--src", src.to_str().unwrap(), "--bits", "8", "--group-size", "32"]).unwrap();
    quantize_drafter::run(args).unwrap();
    let out = s.join("drafter-affine-q8-g32");
    assert_eq!(json(&out.join("dspark.json"))["quantization"]["bits"], 8);
    // A second run refuses the now non-empty output, then --force replaces it.
    let args = parse(&["--src", src.to_str().unwrap(), "--bits", "8", "--group-size", "32"]).unwrap();
    let e = quantize_drafter::run(args).unwrap_err();
    assert!(e.to_string().contains("--force"), "{e}");
    let args =
        parse(&["--src", src.to_str().unwrap(), "--bits", "8", "--group-size", "32", "--force", "--no-smoke"]).unwrap();
    quantize_drafter::run(args).unwrap();
    let bad = parse(&["--src", src.to_str().unwrap(), "--bits", "3"]).unwrap();
    assert!(quantize_drafter::run(bad).unwrap_err().to_string().contains("expected 4 or 8"));
}

/// Every file under `dir` with its bytes, to compare before and after.
fn snapshot(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn refuses_an_out_that_is_contains_or_is_inside_the_source() {
    let s = Scratch::create("cli-out");
    let src = write_dspark(&s.join("drafter"), dspark_config(64));
    std::fs::create_dir_all(s.join("sibling")).unwrap();
    std::fs::write(s.join("sibling/keep.txt"), "precious").unwrap();
    let before = snapshot(&s.0);
    let (parent, nested, dotted) = (s.0.clone(), src.join("q4"), s.join("sibling/../drafter/."));
    for (out, why) in [
        (&parent, "contains the source"),
        (&src, "is the source"),
        (&dotted, "is the source"),
        (&nested, "is inside the source"),
    ] {
        let args = parse(&["--src", src.to_str().unwrap(), "--out", out.to_str().unwrap(), "--force", "--no-smoke"]);
        let e = quantize_drafter::run(args.unwrap()).unwrap_err().to_string();
        assert!(e.contains("--out") && e.contains(why), "--out {}: {e}", out.display());
        assert_eq!(snapshot(&s.0), before, "--out {} changed files", out.display());
    }
    assert!(!nested.exists());
}
