//! Recovery of what killed `StagedDir` writers leave behind, with the crash states built on
//! disk by hand: a run killed between the two renames of a `force` replacement, and staging
//! directories of runs killed while writing.

mod common;

use std::path::Path;
use std::process::Command;

use gemma4::staging::{aside, recover, staging_path, StagedDir};

/// The id of a process that has exited (and been reaped).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn write(dir: &Path, text: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), text).unwrap();
}

fn read(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("config.json")).unwrap()
}

fn siblings(parent: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(parent).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn kill_between_the_renames_restores_the_old_output() {
    let parent = common::Scratch::new("staging-between");
    let dest = parent.join("out");
    let pid = dead_pid();
    // The killed run had moved the old output aside and not yet moved the new one in.
    let tmp = staging_path(&dest, pid);
    write(&aside(&tmp), "old");
    write(&tmp, "new");
    assert!(!dest.exists());
    // Without force the restored output is refused as non-empty, but it is back in place.
    let e = StagedDir::new(&dest, false).err().expect("a restored non-empty output needs force");
    assert!(e.to_string().contains("not empty"), "{e}");
    assert_eq!(read(&dest), "old");
    assert_eq!(siblings(&parent), vec!["out".to_string()], "stale staging dirs must be gone");
}

#[test]
fn recover_reports_what_it_did() {
    let parent = common::Scratch::new("staging-report");
    let dest = parent.join("out");
    let pid = dead_pid();
    let tmp = staging_path(&dest, pid);
    write(&aside(&tmp), "old");
    write(&tmp, "new");
    let rec = recover(&dest).unwrap();
    assert_eq!(rec.restored, Some(aside(&tmp)));
    assert_eq!(rec.removed, vec![tmp.clone()]);
    assert_eq!(read(&dest), "old");
    // A forced write afterwards replaces it normally.
    let staged = StagedDir::new(&dest, true).unwrap();
    write(staged.path(), "newer");
    staged.commit().unwrap();
    assert_eq!(read(&dest), "newer");
    assert_eq!(siblings(&parent), vec!["out".to_string()]);
}

#[test]
fn kill_after_the_renames_drops_the_parked_copy() {
    let parent = common::Scratch::new("staging-after");
    let dest = parent.join("out");
    write(&dest, "new");
    write(&aside(&staging_path(&dest, dead_pid())), "old");
    let staged = StagedDir::new(&dest, true).unwrap();
    drop(staged);
    assert_eq!(read(&dest), "new");
    assert_eq!(siblings(&parent), vec!["out".to_string()]);
}

#[test]
fn staging_dirs_of_dead_runs_are_cleaned_and_live_ones_kept() {
    let parent = common::Scratch::new("staging-stale");
    let dest = parent.join("out");
    write(&staging_path(&dest, dead_pid()), "half");
    let mut live = Command::new("sleep").arg("30").spawn().unwrap();
    let live_tmp = staging_path(&dest, live.id());
    write(&live_tmp, "writing");
    write(&aside(&live_tmp), "parked by a live run");
    let staged = StagedDir::new(&dest, false).unwrap();
    write(staged.path(), "mine");
    staged.commit().unwrap();
    assert_eq!(read(&dest), "mine");
    let left = siblings(&parent);
    let live_name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(left, vec![live_name(&live_tmp), live_name(&aside(&live_tmp)), "out".to_string()]);
    live.kill().unwrap();
    live.wait().unwrap();
}

#[test]
fn a_forced_file_dest_leaves_no_parked_copy_behind() {
    let parent = common::Scratch::new("staging-file-dest");
    let dest = parent.join("out");
    std::fs::create_dir_all(&*parent).unwrap();
    std::fs::write(&dest, "a file where the output goes").unwrap();
    let staged = StagedDir::new(&dest, true).unwrap();
    write(staged.path(), "new");
    staged.commit().unwrap();
    assert_eq!(read(&dest), "new");
    assert_eq!(siblings(&parent), vec!["out".to_string()], "the replaced file was parked and left behind");
}
