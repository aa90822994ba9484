//! `dspark regen` end to end through the binary: shards and a summary line, a rerun that skips
//! everything, `--from-text`, and refusals that name the flag or the file and line and leave
//! `--out` unwritten.

use std::path::Path;
use std::process::{Command, Output};

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use mlx_core::Dtype;
use train::shards::{list_shards, read_shard, TargetId};

use gemma4::testing::Scratch;

fn dspark(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dspark")).args(args).env("DSPARK_HOME", home).output().expect("run dspark")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "dspark failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn regen_writes_shards_resumes_and_reads_documents() {
    let sc = Scratch::create("ok");
    let model = write_random_checkpoint(&sc.join("model"), &tiny_config_a(), 3, Dtype::Bf16, 1, false).unwrap();
    let prompts = sc.join("prompts.jsonl");
    std::fs::write(&prompts, "t5 t6 t7\n{\"prompt\": \"t8 t9\"}\n\nt10\n").unwrap();
    let out = sc.join("data");
    let home = sc.join("home");
    let args = ["regen", "--model", s(&model), "--prompts", s(&prompts), "--out", s(&out)];
    let stdout = ok(&dspark(&home, &[&args[..], &["--max-new", "6", "--seqs-per-shard", "2"]].concat()));
    assert!(stdout.contains("regen: 3 sequences") && stdout.contains("2 shards"), "{stdout}");
    assert!(stdout.contains("taps [1, 3, 4, 6]"), "{stdout}");
    let target = TargetId::of(&tiny_config_a());
    let shards = list_shards(&out, Some((&target, &[1, 3, 4, 6]))).unwrap();
    assert_eq!(shards.len(), 2);
    let first = read_shard(&shards[0]).unwrap();
    assert_eq!(&first.ids[..3], &[5, 6, 7]);
    assert_eq!(first.seqs[0].2, 3);

    // Rerun: everything is already done.
    let stdout = ok(&dspark(&home, &[&args[..], &["--max-new", "6", "--seqs-per-shard", "2"]].concat()));
    assert!(stdout.contains("regen: 0 sequences") && stdout.contains("3 inputs already done"), "{stdout}");
    // Other settings on the same directory are refused.
    fails_with(&dspark(&home, &[&args[..], &["--max-new", "7"]].concat()), &["regen.ledger:1", "settings"]);

    // Documents, teacher-forced in pieces of at most 4 tokens, with explicit taps.
    let docs = sc.join("docs.txt");
    std::fs::write(&docs, "t5 t6 t7 t8 t9 t10\n{\"text\": \"t11 t12\"}\n").unwrap();
    let tout = sc.join("text");
    let stdout = ok(&dspark(
        &home,
        &["regen", "--model", s(&model), "--from-text", s(&docs), "--out", s(&tout), "--max-len", "4", "--taps", "2,6"],
    ));
    assert!(stdout.contains("regen: 3 sequences, 8 tokens, 1 shards"), "{stdout}");
    let sh = read_shard(&list_shards(&tout, Some((&target, &[2, 6]))).unwrap()[0]).unwrap();
    assert_eq!(sh.seqs, vec![(0, 4, 1), (4, 2, 1), (6, 2, 1)]);
}

#[test]
fn regen_refusals_name_the_flag_or_line_and_write_nothing() {
    let sc = Scratch::create("bad");
    let model = write_random_checkpoint(&sc.join("model"), &tiny_config_a(), 3, Dtype::Bf16, 1, false).unwrap();
    let home = sc.join("home");
    let prompts = sc.join("prompts.jsonl");
    std::fs::write(&prompts, "t5 t6\n{\"prompt\": [1, 2]}\n").unwrap();
    let out = sc.join("data");
    let base = ["regen", "--model", s(&model), "--prompts", s(&prompts), "--out", s(&out)];
    fails_with(&dspark(&home, &base), &["prompts.jsonl:2", "string \"prompt\""]);
    std::fs::write(&prompts, "t5 t6\n").unwrap();
    for (extra, needles) in [
        (&["--taps", "1,3"][..], &["--taps", "the last tap must be 6, the final-norm output"][..]),
        (&["--taps", "1,x,6"], &["--taps", "\"x\" is not a layer index"]),
        (&["--taps", "1,9"], &["--taps", "outside 0..=6"]),
        (&["--seqs-per-shard", "0"], &["--seqs-per-shard 0: must be at least 1"]),
        (&["--max-new", "-3"], &["--max-new -3"]),
        (&["--temperature", "-1"], &["'-1' for '--temperature", "got -1.0"]),
        (&["--max-len", "8"], &["--max-len", "--from-text"]),
    ] {
        let r = dspark(&home, &[&base[..], extra].concat());
        assert!(!r.status.success(), "{extra:?} succeeded");
        fails_with(&r, needles);
        assert!(!out.exists(), "{extra:?} wrote {}", out.display());
    }
    // An item the model cannot take is named by its line.
    std::fs::write(&prompts, "t5 t6\n\n{\"prompt\": \" \"}\n").unwrap();
    let o2 = sc.join("data2");
    fails_with(
        &dspark(&home, &["regen", "--model", s(&model), "--prompts", s(&prompts), "--out", s(&o2)]),
        &["prompts.jsonl:3: \" \" encodes to no tokens"],
    );
    std::fs::write(&prompts, "t5 t6\n").unwrap();
    fails_with(
        &dspark(&home, &["regen", "--model", s(&model), "--prompts", s(&prompts), "--out", s(&model)]),
        &["--out", "is the source"],
    );
    // An --out holding something else: refused, then accepted with --force (which leaves the
    // other file alone).
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    fails_with(&dspark(&home, &[&base[..], &["--max-new", "2"]].concat()), &["not a regen directory", "--force"]);
    ok(&dspark(&home, &[&base[..], &["--max-new", "2", "--force"]].concat()));
    assert_eq!(std::fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");
    assert_eq!(list_shards(&out, None).unwrap().len(), 1);
}
