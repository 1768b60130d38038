//! The agent at its default 19 Hz reads a new program's maps only once it has lived a while or a
//! sample of it asks (profiler/src/process/tracker/lazy.rs): a shell loop's commands of a few
//! milliseconds are never read, while a program started beside them is unwound whole and
//! labelled with its rank as before. Run as root (the agent profiles the whole machine).

mod common;

use std::process::Command;

use common::agent::*;
use common::receiver::Receiver;
use common::*;

/// Samples of `r` whose user stack holds main;a;b;c (tests/programs/chain.c), and all of them.
fn whole_chain(r: &common::receiver::Received) -> (i64, i64) {
    let p = &r.profile;
    let chain = ["main", "a", "b", "c"];
    let (mut whole, mut all) = (0, 0);
    for s in &p.samples {
        let names: Vec<&str> = s.stack.iter().map(|&l| p.locations[l].lines[0].function.as_str()).collect();
        let n = s.values[0] / p.period;
        all += n;
        if names.windows(chain.len()).any(|w| w == chain) {
            whole += n;
        }
    }
    (whole, all)
}

#[test]
fn at_19_hz_commands_of_milliseconds_are_never_read_and_a_new_program_is_whole_and_ranked() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("lazy_ranked");
    std::fs::copy(build_c(dir.path(), "chain", FP_FLAGS), &exe).unwrap();
    let receiver = Receiver::start(Box::new(|_| 200));
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // The default frequency, 19 Hz: the one the lazy reads are for.
    let agent = agent(&["--server", &receiver.url(), "--window", "30", "--metrics-addr", &metrics_port.to_string()]);
    // Both start after the agent: new programs, read late. The loop counts its commands.
    let count = dir.path().join("commands");
    let script = format!("n=0; while :; do sleep 0.005; n=$((n + 1)); echo $n > {}; done", count.display());
    let churn = Workload(Command::new("sh").args(["-c", &script]).spawn().unwrap());
    let ranked = Workload(Command::new(&exe).arg("60").env("RANK", "5").env("WORLD_SIZE", "8").spawn().unwrap());
    // The shell truncates the file before it writes the count: a read between the two finds it
    // empty (a CI run counted 0 commands while 411 programs exited), so it is read again, for up
    // to 2 s (a loaded CI machine left it empty for more than 100 ms: 0 - first overflowed).
    let commands = || {
        (0..2000)
            .find_map(|_| std::fs::read_to_string(&count).ok().and_then(|t| t.trim().parse::<u64>().ok()).or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                None
            }))
            .unwrap_or(0)
    };
    let (before, first) = (http_get(metrics_port), commands());
    // CPU time, not wall time: a loaded machine gives the program its samples later.
    wait_cpu(ranked.0.id(), 3.0);
    let (after, last) = (http_get(metrics_port), commands());
    let log = agent.stop();
    drop((churn, ranked));

    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    let (read, saved, started) = (delta("gpuflame_process_maps_read_total"), delta("gpuflame_process_maps_reads_saved_total"), last.saturating_sub(first));
    eprintln!("{started} commands run; maps read {read}, programs exited unread {saved}");
    // Every command was read once or twice before. Most exit before their delay (10.5 ms): 95%
    // on a quiet machine, 75% beside two CPU hogs, where a `sleep 0.005` waits for a CPU to run
    // and lives longer. Programs of others that exit unread only add.
    assert!(started >= 100, "the loop ran only {started} commands");
    assert!(saved * 2 >= started, "{saved} programs exited unread, of {started} commands ({read} maps read):\n{log}");

    let got = receiver.received();
    let series: Vec<_> = service(&got, "lazy_ranked").into_iter().filter(|r| r.labels["__name__"] == "process_cpu").collect();
    assert_eq!(series.len(), 1, "one series: {:?}\n{log}", series.iter().map(|r| &r.sent_labels).collect::<Vec<_>>());
    let r = series[0];
    // Its environment is read with its maps, late: the labels are there all the same.
    assert_eq!(r.sent_labels.get("rank").map(String::as_str), Some("5"), "{:?}", r.sent_labels);
    assert_eq!(r.sent_labels.get("world_size").map(String::as_str), Some("8"), "{:?}", r.sent_labels);
    // 3 s of CPU at 19 Hz: ~57 samples. Its first may come before its maps are read, and be
    // unwound with the tables published by file: one VMA a sample, so it can stop early.
    let (whole, all) = whole_chain(r);
    eprintln!("{whole} of {all} samples whole");
    assert!(all >= 30, "{all} samples for 3 s of CPU at 19 Hz");
    assert!(whole + 2 >= all, "only {whole} of {all} samples carry main;a;b;c");
    assert_clean(&receiver);
}
