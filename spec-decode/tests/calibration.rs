//! The calibration run: decodes give rounds and fits for both modes, a rounds file of them
//! refits to the same scaling, and user data the run cannot use is refused with a reason.

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use gemma4::Model;
use mlx_core::Dtype;
use spec_decode::calibration::rounds_file::{read_rounds, rounds_text};
use spec_decode::calibration::{calibrate, CalibrationError, CalibrationSettings, Progress, RoundSource};
use spec_decode::oracle::SelfDrafter;
use spec_decode::testing::ScriptedConfidence;

const GAMMA: usize = 3;

fn settings() -> CalibrationSettings {
    CalibrationSettings {
        temperatures: vec![0.0, 1.0],
        tokens: 12,
        stop_tokens: Vec::new(),
        target: 0.5,
        min_samples: 1,
        min_map_rounds: 1,
        keep_rounds: true,
    }
}

/// The target drafting for itself, with confidences drawn from a script (inside (0, 1): a
/// confidence of 0 or 1 has an infinite logit, which a rounds file cannot hold).
fn drafter() -> ScriptedConfidence<SelfDrafter> {
    ScriptedConfidence::new(SelfDrafter::new(GAMMA), vec![0.2, 0.6, 0.9], Box::new(|t| (t % 7 + 1) as f32 / 9.0), 5)
}

#[test]
fn decodes_fit_both_modes_and_their_rounds_refit_the_same() {
    let dir = gemma4::testing::scratch("calibration-run");
    let model_dir = write_random_checkpoint(&dir, &tiny_config_a(), 77, Dtype::F32, 1, true).unwrap();
    let model = Model::load(&model_dir).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| (0..6).map(|j| 4 + (i * 31 + j * 17) % 300).collect()).collect();
    let (mut decoded, mut fitted) = (Vec::new(), Vec::new());
    let run = calibrate(&model, &mut drafter(), RoundSource::Decode(&prompts), &settings(), |p| match p {
        Progress::Decoded { mode, prompt, prompts, .. } => decoded.push(format!("{mode} {prompt}/{prompts}")),
        Progress::Fitted(m) => fitted.push(m.label.clone()),
        _ => {}
    })
    .unwrap();
    assert_eq!(decoded.len(), 8, "{decoded:?}");
    assert_eq!(decoded[0], "greedy 1/4");
    assert_eq!(fitted, ["greedy", "sampled, T = 1"]);
    let cal = &run.calibration;
    assert_eq!(cal.thresholds.len(), GAMMA);
    let (greedy, sampled) = (cal.greedy.as_ref().unwrap(), cal.sampled.as_ref().unwrap());
    assert_eq!((greedy.sampling_temperature, sampled.sampling_temperature), (0.0, 1.0));
    for m in &run.modes {
        assert!(!m.held_out.is_empty() && m.fit.rounds > 0, "{}", m.label);
        assert_eq!((m.before.len(), m.scaled.len(), m.after.len()), (GAMMA, GAMMA, GAMMA));
    }
    assert!(run.rounds.iter().all(|r| r.prompt < 4 && r.accepted <= r.logits.len()));

    // The rounds file holds every round; refitting from it needs no decode.
    let file = dir.join("rounds.jsonl");
    std::fs::write(&file, rounds_text(&run.rounds).unwrap()).unwrap();
    assert_eq!(read_rounds(&file, GAMMA).unwrap(), run.rounds);
    let mut decodes = 0;
    let refit = calibrate(&model, &mut drafter(), RoundSource::File(&file), &settings(), |p| {
        decodes += usize::from(matches!(p, Progress::Decoded { .. }));
    })
    .unwrap();
    assert_eq!(decodes, 0);
    assert_eq!(refit.calibration.greedy.as_ref(), Some(greedy));
    assert_eq!(refit.calibration.sampled.as_ref(), Some(sampled));

    // A rounds file without the sampled mode cannot calibrate it.
    let greedy_only: Vec<_> = run.rounds.iter().filter(|r| r.temperature == 0.0).cloned().collect();
    std::fs::write(&file, rounds_text(&greedy_only).unwrap()).unwrap();
    let e = calibrate(&model, &mut drafter(), RoundSource::File(&file), &settings(), |_| {}).unwrap_err();
    assert!(matches!(e, CalibrationError::NoRoundsAt { temperature: 1.0, .. }), "{e}");
}

#[test]
fn unusable_input_is_refused_with_a_reason() {
    let dir = gemma4::testing::scratch("calibration-refusals");
    let model_dir = write_random_checkpoint(&dir, &tiny_config_a(), 78, Dtype::F32, 1, true).unwrap();
    let model = Model::load(&model_dir).unwrap();
    let one = vec![vec![5u32, 6, 7]];
    let e = calibrate(&model, &mut drafter(), RoundSource::Decode(&one), &settings(), |_| {}).unwrap_err();
    assert_eq!(e.to_string(), "1 prompt(s): calibration needs at least 2 (half fit, half held out)");
    let two = vec![vec![5u32, 6, 7], vec![8, 9]];
    let e = calibrate(&model, &mut SelfDrafter::new(GAMMA), RoundSource::Decode(&two), &settings(), |_| {});
    assert!(matches!(e, Err(CalibrationError::NoConfidence { .. })));

    for (s, msg) in [
        (CalibrationSettings { target: 0.0, ..settings() }, "target 0: expected a precision in (0, 1]"),
        (CalibrationSettings { tokens: 0, ..settings() }, "tokens 0: expected at least 1 token per prompt"),
        (
            CalibrationSettings { temperatures: vec![-1.0], ..settings() },
            "temperatures [-1.0]: -1 is not a temperature (expected 0 for greedy, or positive)",
        ),
        (
            CalibrationSettings { temperatures: vec![0.5, 1.0], ..settings() },
            "temperatures [0.5, 1.0]: expected 0 (greedy), one positive temperature (sampled), or both",
        ),
    ] {
        assert_eq!(s.check().unwrap_err().to_string(), msg);
    }

    let file = dir.join("bad.jsonl");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&file, "{\"temperature\": 0, \"prompt\": 0, \"logits\": [0.5], \"accepted\": 0}\n\nnot json\n")
        .unwrap();
    let e = read_rounds(&file, GAMMA).unwrap_err();
    assert!(matches!(e, CalibrationError::NotARound { line: 3, .. }), "{e}");
    std::fs::write(&file, "{\"temperature\": 0, \"prompt\": 0, \"logits\": [0.5, 1, 2, 3], \"accepted\": 0}\n")
        .unwrap();
    let e = read_rounds(&file, GAMMA).unwrap_err().to_string();
    assert!(e.ends_with("bad.jsonl line 1: a round of 4 drafts with 0 accepted; expected 1 to gamma = 3 drafts and at most that many accepted"), "{e}");
    let e = read_rounds(&dir.join("absent.jsonl"), GAMMA).unwrap_err();
    assert!(matches!(e, CalibrationError::Read { .. }), "{e}");
}
