//! `memctl ask`: a question about a document of any length, through the memory loop.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::Result;
use indicatif::ProgressBar;
use memagent_agent::{AgentRun, AnswerReport, Progress, StepReport, NO_MEMORY};
use memagent_store::MemoryVersion;
use serde_json::json;

use super::ModelBackend;
use crate::cli::AskArgs;
use crate::settings::Settings;

pub fn run(global: &Settings, args: &AskArgs) -> Result<()> {
    let document = super::read_document(args.file.as_deref())?;
    let backend = ModelBackend::open(global, &args.run)?;
    if args.direct {
        let report = backend.with_agent(|agent| Ok(agent.direct(&document, &args.question)?))?;
        return print_direct(args, &report);
    }
    let show_progress = !global.quiet && !args.json && std::io::stderr().is_terminal();
    let mut display = StepDisplay::new(show_progress, args.show_memory && !args.json);
    // With evidence, the document's passages are indexed while the model loads.
    let found = match args.memory_only {
        true => None,
        false => Some(super::recall::document_evidence(
            super::recall::load_embedder(global)?,
            &document,
            &args.question,
            memagent_memory::passages_searched(&args.question, args.passages),
        )?),
    };
    let (run, evidence) = backend.with_agent(|agent| {
        let run = agent.run(&document, &args.question, &mut |p| display.on(p))?;
        let evidence = match found {
            None => None,
            Some(found) => {
                let memory = MemoryVersion {
                    text: run
                        .steps
                        .last()
                        .map_or(NO_MEMORY.to_string(), |s| s.memory.clone()),
                    ..memagent_memory::empty_memory()
                };
                let question = [args.question.clone()];
                let mut answered = memagent_memory::answer_with_evidence(
                    agent,
                    &memory,
                    &question,
                    vec![found],
                    args.evidence_tokens,
                )?;
                answered.pop().map(|a| (a.report, a.passages))
            }
        };
        Ok((run, evidence))
    })?;
    display.finish();
    tracing::info!(
        "{} input tokens in {} chunks, {:.1}s ({:.0} input tokens/s)",
        run.input_tokens,
        run.steps.len(),
        run.seconds,
        run.input_tokens as f64 / run.seconds.max(f64::EPSILON)
    );
    let mut value = run_json(&run);
    let answer = match &evidence {
        None => run.final_answer.answer.clone(),
        Some((report, used)) if !args.json => super::recall::with_citations(&report.answer, used),
        Some((report, used)) => {
            // The memory's own answer stays beside it, under `memory_answer`.
            value["mode"] = json!("evidence");
            value["memory_answer"] =
                json!({"answer": value["answer"], "extracted": value["extracted"]});
            value["answer"] = json!(report.reply);
            value["extracted"] = json!(report.answer);
            value["passages"] = serde_json::to_value(used)?;
            value["templates"]["final"] = serde_json::to_value(report.template)?;
            report.answer.clone()
        }
    };
    if args.json {
        super::print_json(&value)
    } else {
        writeln!(std::io::stdout().lock(), "{answer}")?;
        Ok(())
    }
}

fn print_direct(args: &AskArgs, report: &AnswerReport) -> Result<()> {
    if args.json {
        let value = json!({
            "mode": "direct",
            "question": args.question,
            "answer": report.reply,
            "extracted": report.answer,
            "template": report.template,
            "prompt_tokens": report.prompt_tokens,
            "completion_tokens": report.completion_tokens,
            "stop_reason": report.stop_reason,
            "seconds": report.seconds,
        });
        super::print_json(&value)
    } else {
        writeln!(std::io::stdout().lock(), "{}", report.answer)?;
        Ok(())
    }
}

/// The JSON form of a run: answer, extracted answer, and per-step statistics.
fn run_json(run: &AgentRun) -> serde_json::Value {
    let f = &run.final_answer;
    json!({
        "mode": "memory",
        "question": run.question,
        "model": run.model,
        "answer": f.reply,
        "extracted": f.answer,
        "profile": run.profile,
        "templates": {"update": run.update_template, "final": f.template},
        "input_tokens": run.input_tokens,
        "chunks": run.steps.len(),
        "seconds": run.seconds,
        "steps": run.steps,
        "final": {
            "prompt_tokens": f.prompt_tokens,
            "completion_tokens": f.completion_tokens,
            "stop_reason": f.stop_reason,
            "seconds": f.seconds,
        },
    })
}

/// Progress on a terminal (chunk i/n, input tokens/s, ETA) and the memories on demand.
struct StepDisplay {
    bar: Option<ProgressBar>,
    show_memory: bool,
    start: Instant,
    tokens_read: usize,
}

impl StepDisplay {
    fn new(show_progress: bool, show_memory: bool) -> Self {
        let bar = super::progress_bar(
            show_progress,
            "{spinner} chunk {pos}/{len} [{bar:30}] {msg} · ETA {eta}",
        );
        Self {
            bar,
            show_memory,
            start: Instant::now(),
            tokens_read: 0,
        }
    }

    fn on(&mut self, progress: Progress<'_>) {
        match progress {
            Progress::Started {
                chunks,
                input_tokens,
            } => {
                self.start = Instant::now();
                if let Some(bar) = &self.bar {
                    bar.set_length(chunks as u64);
                    bar.set_message(format!("{input_tokens} tokens"));
                }
            }
            Progress::Step { step, chunks } => {
                self.tokens_read += step.chunk_tokens;
                let rate = self.tokens_read as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
                if let Some(bar) = &self.bar {
                    bar.set_position(step.index as u64);
                    bar.set_message(format!("{rate:.0} input tok/s"));
                }
                if self.show_memory {
                    self.print_memory(step, chunks);
                }
            }
            Progress::Answering => {
                if let Some(bar) = &self.bar {
                    bar.set_message("answering".to_string());
                }
            }
        }
    }

    fn print_memory(&self, step: &StepReport, chunks: usize) {
        let text = format!(
            "--- memory after chunk {}/{chunks} ({} tokens{}) ---\n{}\n",
            step.index,
            step.memory_tokens,
            if step.cut { ", cut at the cap" } else { "" },
            step.memory
        );
        // A closed stdout is reported when the answer is written.
        let write = || {
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        };
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
