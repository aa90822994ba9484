//! `train::regen` on a tiny random target: shards hold exactly what `generate` and a fresh
//! tapped forward produce, reruns resume from the ledger, and bad settings, inputs and output
//! directories are refused before anything is written.

use std::path::Path;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use gemma4::generate::{generate, ids_array, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use gemma4::Model;
use mlx_core::{Array, Dtype};
use train::regen::{
    default_taps, read_input_lines, read_inputs, regen, tap_set, RegenMode, RegenOptions, RegenSummary, LEDGER,
};
use train::shards::{list_shards, read_shard, write_shard, Sequence, TargetId};

use gemma4::testing::Scratch;

fn target(s: &Scratch) -> (Model, Tokenizer) {
    let dir = write_random_checkpoint(&s.join("target"), &tiny_config_a(), 7, Dtype::Bf16, 1, true).unwrap();
    (Model::load(&dir).unwrap(), Tokenizer::from_dir(&dir).unwrap())
}

fn prompts() -> Vec<String> {
    (0..6)
        .map(|i| (0..3 + i).map(|j| format!("t{}", 5 + (i * 31 + j * 7) % 500)).collect::<Vec<_>>().join(" "))
        .collect()
}

fn opts(taps: Vec<usize>, per_shard: usize) -> RegenOptions {
    RegenOptions {
        mode: RegenMode::Generate { max_new: 12, temperature: 0.0, seed: 0 },
        taps,
        seqs_per_shard: per_shard,
        force: false,
        labels: Vec::new(),
        plain_prompts: false,
    }
}

fn run(m: &Model, tok: &Tokenizer, inputs: &[String], out: &Path, o: &RegenOptions) -> train::Result<RegenSummary> {
    regen(m, Some(tok), inputs, out, o, |_| {})
}

/// Every stored sequence: ids, response start and rows as f32 bits.
fn stored(out: &Path) -> Vec<(Vec<u32>, usize, Vec<u32>)> {
    let mut v = Vec::new();
    for dir in list_shards(out, None).unwrap() {
        let sh = read_shard(&dir).unwrap();
        let width = sh.rows.shape().unwrap()[1] as usize;
        let rows = sh.rows.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
        for &(at, len, resp) in &sh.seqs {
            let bits = rows[at * width..(at + len) * width].iter().map(|x| x.to_bits()).collect();
            v.push((sh.ids[at..at + len].to_vec(), resp, bits));
        }
    }
    v
}

fn fresh_rows(m: &Model, taps: &[usize], ids: &[u32]) -> Vec<u32> {
    let t = tap_set(taps, m.config().num_hidden_layers);
    let rows = m.forward_tapped(&ids_array(ids).unwrap(), None, &t).unwrap().taps.unwrap();
    let rows: Array = rows.squeeze(0).unwrap().astype(Dtype::Bf16).unwrap().astype(Dtype::F32).unwrap();
    rows.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

fn shard_names(out: &Path) -> Vec<String> {
    list_shards(out, None).unwrap().iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect()
}

#[test]
fn shards_hold_generate_output_and_fresh_tapped_rows() {
    let s = Scratch::create("exact");
    let (m, tok) = target(&s);
    let taps = default_taps(m.config().num_hidden_layers);
    assert_eq!(taps, vec![1, 3, 4, 6]);
    let out = s.join("data");
    let mut calls = Vec::new();
    let sum = regen(&m, Some(&tok), &prompts(), &out, &opts(taps.clone(), 4), |p| calls.push(p)).unwrap();
    assert_eq!((sum.sequences, sum.shards, sum.skipped), (6, 2, 0));
    assert_eq!(shard_names(&out), ["shard_00000", "shard_00001"]);
    assert_eq!(calls.first().map(|p| (p.done, p.total)), Some((0, 6)));
    assert_eq!(calls.last().map(|p| (p.done, p.total, p.shards)), Some((6, 6, 2)));
    // Shards are checked against the target and the tap set.
    list_shards(&out, Some((&TargetId::of(m.config()), &taps))).unwrap();

    let seqs = stored(&out);
    assert_eq!(seqs.len(), 6);
    let mut total = 0;
    for (p, (ids, resp, rows)) in prompts().iter().zip(&seqs) {
        let prompt = tok.encode(p, true).unwrap();
        let cfg = GenerateConfig {
            max_tokens: 12,
            stop_tokens: stop_tokens(m.config(), Some(&tok)),
            ..GenerateConfig::default()
        };
        let gen = generate(&m, &prompt, &cfg, |_| {}).unwrap();
        assert!(!gen.tokens.is_empty());
        assert_eq!(*ids, [prompt.clone(), gen.tokens].concat());
        assert_eq!(*resp, prompt.len());
        assert_eq!(*rows, fresh_rows(&m, &taps, ids), "rows must be bit-equal to a fresh tapped forward");
        total += ids.len();
    }
    assert_eq!(sum.tokens, total);
    let ledger = std::fs::read_to_string(out.join(LEDGER)).unwrap();
    assert_eq!(ledger.lines().count(), 3, "a header and one line per shard: {ledger}");
}

#[test]
fn sampling_uses_seed_plus_item_index() {
    let s = Scratch::create("sample");
    let (m, tok) = target(&s);
    let out = s.join("data");
    let o = RegenOptions { mode: RegenMode::Generate { max_new: 10, temperature: 1.5, seed: 40 }, ..opts(vec![6], 8) };
    let ps = prompts();
    run(&m, &tok, &ps[..3], &out, &o).unwrap();
    for (i, (ids, resp, _)) in stored(&out).into_iter().enumerate() {
        let prompt = tok.encode(&ps[i], true).unwrap();
        let cfg = GenerateConfig {
            max_tokens: 10,
            sampler: SamplerConfig { temperature: 1.5, ..SamplerConfig::default() },
            seed: 40 + i as u64,
            stop_tokens: stop_tokens(m.config(), Some(&tok)),
            ..GenerateConfig::default()
        };
        let gen = generate(&m, &prompt, &cfg, |_| {}).unwrap();
        assert_eq!(ids[resp..], gen.tokens[..]);
    }
}

#[test]
fn rerun_skips_committed_prompts_and_crash_leftovers_are_redone() {
    let s = Scratch::create("resume");
    let (m, tok) = target(&s);
    let out = s.join("data");
    let o = opts(vec![2, 6], 2);
    run(&m, &tok, &prompts(), &out, &o).unwrap();
    let reference = stored(&out);
    assert_eq!(shard_names(&out).len(), 3);

    // Nothing deleted: everything is skipped, nothing rewritten.
    let sum = run(&m, &tok, &prompts(), &out, &o).unwrap();
    assert_eq!((sum.skipped, sum.sequences, sum.shards, sum.orphans_removed), (6, 0, 0, 0));
    assert_eq!(stored(&out), reference);

    // More prompts later: only the new ones run, numbering continues.
    let mut more = prompts();
    more.push("t9 t10 t11".into());
    let sum = run(&m, &tok, &more, &out, &o).unwrap();
    assert_eq!((sum.skipped, sum.sequences, sum.shards), (6, 1, 1));
    assert_eq!(shard_names(&out).last().map(String::as_str), Some("shard_00003"));

    // A crash after shards 1..3 were committed but before the ledger named them, with a staging
    // directory left behind: those shards are removed and their prompts regenerated.
    let ledger = out.join(LEDGER);
    let text = std::fs::read_to_string(&ledger).unwrap();
    std::fs::write(&ledger, text.lines().take(2).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    std::fs::create_dir_all(out.join(".shard_00004.tmp-999999")).unwrap();
    let sum = run(&m, &tok, &more, &out, &o).unwrap();
    assert_eq!((sum.orphans_removed, sum.skipped, sum.sequences, sum.shards), (3, 2, 5, 3));
    assert!(!out.join(".shard_00004.tmp-999999").exists());
    assert_eq!(stored(&out)[..6], reference[..], "regenerated shards equal the uninterrupted run");
    assert_eq!(shard_names(&out), ["shard_00000", "shard_00001", "shard_00002", "shard_00003"]);

    // A ledger whose last line was torn by an interrupted write: the line is dropped, its
    // shard removed as an orphan and regenerated (regen refused to resume before, and --force
    // deleted every shard).
    let text = std::fs::read_to_string(&ledger).unwrap();
    let keep = text.trim_end().rfind('\n').unwrap();
    let torn = &text[..keep + 1 + (text.len() - keep) / 2];
    std::fs::write(&ledger, torn).unwrap();
    let sum = run(&m, &tok, &more, &out, &o).unwrap();
    assert_eq!((sum.orphans_removed, sum.skipped, sum.sequences, sum.shards), (1, 6, 1, 1));
    assert_eq!(stored(&out)[..6], reference[..], "the regenerated shard equals the uninterrupted run");
    assert_eq!(shard_names(&out), ["shard_00000", "shard_00001", "shard_00002", "shard_00003"]);
    // A damaged line that is not the torn tail is still refused.
    let text = std::fs::read_to_string(&ledger).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1] = "{\"shard\": oops";
    std::fs::write(&ledger, lines.join("\n") + "\n").unwrap();
    let e = run(&m, &tok, &more, &out, &o).unwrap_err().to_string();
    assert!(e.contains("regen.ledger:2") && e.contains("not a ledger entry"), "{e}");
    std::fs::write(&ledger, text).unwrap();

    // A shard deleted by hand: its prompts are regenerated into a new shard.
    std::fs::remove_dir_all(out.join("shard_00001")).unwrap();
    let sum = run(&m, &tok, &more, &out, &o).unwrap();
    assert_eq!((sum.skipped, sum.sequences), (5, 2));
    assert_eq!(shard_names(&out), ["shard_00000", "shard_00002", "shard_00003", "shard_00004"]);

    // A changed prompts file is noticed; other settings are refused; --force starts over.
    let mut changed = more.clone();
    changed[0] = "t5 t5".into();
    let e = run(&m, &tok, &changed, &out, &o).unwrap_err().to_string();
    assert!(e.contains("input item 0: differs") && e.contains("changed"), "{e}");
    let e = run(&m, &tok, &more[..3], &out, &o).unwrap_err().to_string();
    assert!(e.contains("only 3 items now"), "{e}");
    let e = run(&m, &tok, &more, &out, &opts(vec![6], 2)).unwrap_err().to_string();
    assert!(e.contains("taps [6]") && e.contains("expected"), "{e}");
    let o13 = RegenOptions { mode: RegenMode::Generate { max_new: 13, temperature: 0.0, seed: 0 }, ..o.clone() };
    let e = run(&m, &tok, &more, &out, &o13).unwrap_err().to_string();
    assert!(e.contains("regen.ledger:1") && e.contains("settings"), "{e}");
    // In words, not Rust's debug form of the settings.
    assert!(e.contains("up to 12 tokens") && e.contains("up to 13 tokens") && !e.contains("Generate {"), "{e}");
    let sum = run(&m, &tok, &changed[..2], &out, &RegenOptions { force: true, ..o13 }).unwrap();
    assert_eq!((sum.skipped, sum.sequences, sum.shards), (0, 2, 1));
    assert_eq!(shard_names(&out), ["shard_00000"]);
}

#[test]
fn taps_without_the_final_norm_are_refused() {
    let s = Scratch::create("taps");
    let (m, tok) = target(&s);
    let out = s.join("data");
    for (taps, want) in [
        (vec![1, 3], "the last tap must be 6, the final-norm output"),
        (vec![6, 3], "the last tap must be 6"),
        (vec![1, 7], "outside 0..=6"),
        (vec![3, 3, 6], "listed twice"),
        (vec![3, 1, 6], "expected increasing layer indices"),
        (vec![], "at least one tap"),
    ] {
        let e = run(&m, &tok, &prompts(), &out, &opts(taps.clone(), 4)).unwrap_err().to_string();
        assert!(e.contains(&format!("taps {taps:?}")) && e.contains(want), "{e}");
    }
    assert!(!out.exists(), "nothing is written before the settings are checked");
}

#[test]
fn foreign_and_non_regen_output_directories_are_refused() {
    let s = Scratch::create("foreign");
    let (m, tok) = target(&s);
    let out = s.join("data");
    // Shards of another target (hidden size 8) with the same taps.
    let other = TargetId { hidden_size: 8, vocab_size: 512, num_layers: 6 };
    let seq = Sequence { ids: vec![5, 6], resp_start: 1, rows: Array::from_slice(&[0.0f32; 32], &[2, 16]).unwrap() };
    write_shard(&out, 0, &other, &[2, 6], &[seq]).unwrap();
    let e = run(&m, &tok, &prompts(), &out, &opts(vec![2, 6], 4)).unwrap_err().to_string();
    assert!(e.contains("shard_00000") && e.contains("expected a target of hidden size 128"), "{e}");
    assert_eq!(shard_names(&out), ["shard_00000"], "the foreign shard is left alone");

    // Something else entirely: refused, then started over with force.
    let other_dir = s.join("notes");
    std::fs::create_dir_all(&other_dir).unwrap();
    std::fs::write(other_dir.join("readme.txt"), "mine").unwrap();
    let e = run(&m, &tok, &prompts(), &other_dir, &opts(vec![6], 4)).unwrap_err().to_string();
    assert!(e.contains("not a regen directory") && e.contains("forced"), "{e}");
    run(&m, &tok, &prompts()[..1], &other_dir, &RegenOptions { force: true, ..opts(vec![6], 4) }).unwrap();
    assert_eq!(
        std::fs::read_to_string(other_dir.join("readme.txt")).unwrap(),
        "mine",
        "force leaves other files alone"
    );
    assert_eq!(shard_names(&other_dir), ["shard_00000"]);
    let forced = RegenOptions { force: true, ..opts(vec![2, 6], 4) };
    run(&m, &tok, &prompts()[..2], &out, &forced).unwrap();
    assert_eq!(read_shard(&out.join("shard_00000")).unwrap().meta.target, TargetId::of(m.config()));
}

#[test]
fn input_lines_are_json_or_text_and_bad_ones_name_file_and_line() {
    let s = Scratch::create("inputs");
    let f = s.join("prompts.jsonl");
    std::fs::write(&f, "{\"prompt\": \"t5 t6\"}\nt7 t8\n\n  {\"prompt\": \"t9\", \"x\": 1}\n").unwrap();
    assert_eq!(read_inputs(&f, "prompt").unwrap(), ["t5 t6", "t7 t8", "t9"]);
    let labelled = read_input_lines(&f, "prompt").unwrap();
    let at = |n: usize| format!("{}:{n}", f.display());
    assert_eq!(labelled.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>(), [at(1), at(2), at(4)]);
    // Errors about an item name its line.
    let s2 = Scratch::create("inputs-model");
    let (m, tok) = target(&s2);
    std::fs::write(&f, "t5 t6\n\n{\"prompt\": \"   \"}\n").unwrap();
    let (labels, items): (Vec<String>, Vec<String>) = read_input_lines(&f, "prompt").unwrap().into_iter().unzip();
    let o = RegenOptions { labels, ..opts(vec![6], 4) };
    let e = run(&m, &tok, &items, &s.join("out"), &o).unwrap_err().to_string();
    assert!(e.contains(&format!("{}: \"   \" encodes to no tokens", at(3))), "{e}");
    for (text, want) in [
        ("t5\n{\"prompt\": 3}\n", "prompts.jsonl:2: expected a JSON object with a string \"prompt\", found 3"),
        ("t5\nt6\n{\"prompt\": \"t5\"\n", "prompts.jsonl:3: a line starting with '{' must be JSON"),
        (
            "{\"text\": \"t5\"}\n",
            "prompts.jsonl:1: expected a JSON object with a string \"prompt\", found no such field",
        ),
    ] {
        std::fs::write(&f, text).unwrap();
        let e = read_inputs(&f, "prompt").unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let e = read_inputs(&s.join("missing.txt"), "prompt").unwrap_err().to_string();
    assert!(e.contains("missing.txt"), "{e}");
}

#[test]
fn from_text_teacher_forces_pieces_with_every_position_an_anchor() {
    let s = Scratch::create("text");
    let (m, tok) = target(&s);
    let out = s.join("data");
    let doc = |n: usize, base: usize| (0..n).map(|j| format!("t{}", base + j)).collect::<Vec<_>>().join(" ");
    // 9 tokens -> pieces of 4, 4 (the trailing single token cannot anchor anything); 3 -> 3.
    let docs = vec![doc(9, 10), doc(3, 40)];
    let o = RegenOptions { mode: RegenMode::FromText { max_len: 4 }, ..opts(vec![3, 6], 2) };
    let sum = run(&m, &tok, &docs, &out, &o).unwrap();
    assert_eq!((sum.sequences, sum.tokens, sum.shards), (3, 11, 2));
    let seqs = stored(&out);
    let all: Vec<u32> = (10..19).collect();
    let expect: Vec<Vec<u32>> = vec![all[..4].to_vec(), all[4..8].to_vec(), vec![40, 41, 42]];
    for ((ids, resp, rows), want) in seqs.iter().zip(&expect) {
        assert_eq!(ids, want);
        assert_eq!(*resp, 1);
        assert_eq!(*rows, fresh_rows(&m, &[3, 6], ids));
    }
    let e = run(&m, &tok, &docs, &s.join("d2"), &RegenOptions { mode: RegenMode::FromText { max_len: 1 }, ..o })
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_len"), "{e}");
}

#[test]
fn chat_template_is_applied_and_ids_without_a_tokenizer_are_read() {
    let s = Scratch::create("chat");
    let (_, _) = target(&s);
    let dir = s.join("target");
    let cfg = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    v["chat_template"] = serde_json::json!(
        "{{ bos_token }}{% for m in messages %}\n{% if m['role'] == 'user' %}t20 {{ m['content'] | trim }} t21 {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}t22{% endif %}"
    );
    std::fs::write(dir.join("tokenizer_config.json"), v.to_string()).unwrap();
    let (m, tok) = (Model::load(&dir).unwrap(), Tokenizer::from_dir(&dir).unwrap());
    let out = s.join("data");
    run(&m, &tok, &[" t5 t6 ".to_string()], &out, &opts(vec![6], 4)).unwrap();
    let (ids, resp, _) = stored(&out).remove(0);
    assert_eq!((&ids[..resp], resp), (&[2, 20, 5, 6, 21, 22][..], 6));

    // A template kept in chat_template.jinja (tokenizer_config.json without one) is read too.
    v.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(dir.join("tokenizer_config.json"), v.to_string()).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{{ bos_token }}t30 {{ messages[0].content }}").unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let out = s.join("jinja");
    run(&m, &tok, &["t5".to_string()], &out, &opts(vec![6], 4)).unwrap();
    let (ids, resp, _) = stored(&out).remove(0);
    assert_eq!(&ids[..resp], &[2, 30, 5]);
    std::fs::write(dir.join("chat_template.jinja"), "{% if %}").unwrap();
    let e = run(&m, &tok, &["t5".to_string()], &s.join("broken"), &opts(vec![6], 4)).unwrap_err().to_string();
    assert!(e.contains("chat template of") && e.contains("chat_template.jinja"), "{e}");
    assert!(!s.join("broken").exists(), "a broken template is refused before anything is written");

    // Without a tokenizer, prompts are token ids.
    let out = s.join("ids");
    regen(&m, None, &["5, 6 7".to_string()], &out, &opts(vec![6], 4), |_| {}).unwrap();
    let (ids, resp, _) = stored(&out).remove(0);
    assert_eq!(&ids[..resp], &[5, 6, 7]);
    let e = regen(&m, None, &["5 x".to_string()], &s.join("bad"), &opts(vec![6], 4), |_| {}).unwrap_err().to_string();
    assert!(e.contains("input item 0") && e.contains("\"x\" is not a token id"), "{e}");
    let e = regen(&m, None, &["5 900".to_string()], &s.join("bad"), &opts(vec![6], 4), |_| {}).unwrap_err().to_string();
    assert!(e.contains("900 is outside the vocabulary of 512"), "{e}");
}
