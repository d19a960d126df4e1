//! A reply's likelihood on the real default model.

use memagent_engine::{log_probability, Error, Message, Weights};

use crate::support::model;

fn messages() -> Vec<Message> {
    vec![Message::user(
        "Ana: I keep bees on the roof of my flat in Porto.\nBen: How many hives?\n\n\
         Write a question that the chat above answers.",
    )]
}

/// The mean log-probability of a reply read in pieces equals the one its tokens get
/// decoded one at a time after the prompt, each predicted from those before it.
#[test]
fn a_reply_likelihood_is_the_mean_of_each_token_predicted_after_those_before_it() {
    let m = model();
    // Longer than one piece of `forward_all`, so that pieces join.
    let reply = "Where does Ana keep her bees, and how many hives does she keep on the roof of \
                 her flat?";
    let got = m
        .reply_log_probability(&messages(), reply, Weights::Base)
        .unwrap();
    let prompt = m.chat_prompt_ids(&messages()).unwrap();
    let ids = m.tokenizer().encode(reply, false).unwrap();
    assert!(ids.len() > memagent_engine::Transformer::MAX_VERIFY + 2);
    let t = m.transformer();
    let mut cache = t.new_cache_with(1, prompt.len() + ids.len(), Weights::Base);
    let mut logits = t.forward(&[prompt], &mut cache).unwrap();
    let mut sum = 0.0;
    for &token in &ids {
        sum += log_probability(&logits.flatten_all().unwrap().to_vec1().unwrap(), token);
        logits = t.forward(&[vec![token]], &mut cache).unwrap();
    }
    let want = sum / ids.len() as f64;
    assert!(got < 0.0, "{got}");
    assert!(
        (got - want).abs() < 1e-9,
        "in pieces {got}, one at a time {want}"
    );
}

/// A question the passage answers is likelier after it than one it does not.
#[test]
fn a_question_the_chat_answers_is_likelier_than_another() {
    let m = model();
    let score = |q: &str| {
        m.reply_log_probability(&messages(), q, Weights::Base)
            .unwrap()
    };
    let about = score("Where does Ana keep her bees?");
    let other = score("What did the fencing club decide about the tournament budget?");
    assert!(about > other, "{about} vs {other}");
}

#[test]
fn an_empty_reply_or_one_past_the_context_is_an_error() {
    let m = model();
    assert!(matches!(
        m.reply_log_probability(&messages(), "", Weights::Base),
        Err(Error::InvalidRequest(_))
    ));
    let long = "bee ".repeat(9_000);
    assert!(matches!(
        m.reply_log_probability(&messages(), &long, Weights::Base),
        Err(Error::ContextOverflow { .. })
    ));
}
