//! A request's `logit_bias` and penalties over real HTTP: read into the options the
//! model thread gets, on both endpoints; out-of-range values and foreign token ids
//! refused by name, before anything reaches the model.

use serde_json::json;

use super::TestServer;
use crate::engine::Penalties;

#[test]
fn bias_and_penalties_reach_the_model_as_asked() {
    let server = TestServer::start();
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "presence_penalty": 0.5, "frequency_penalty": -1.25, "repetition_penalty": 1.2,
        "logit_bias": {"50": 100, "7": -2.5}});
    let (status, body) = server.post("/v1/chat/completions", chat);
    assert_eq!(status, 200, "{body}");
    let asked = server.asked()[0].opts.penalties.clone();
    let wanted = Penalties {
        presence: 0.5,
        frequency: -1.25,
        repetition: 1.2,
        bias: vec![(7, -2.5), (50, 100.0)],
    };
    assert_eq!(asked, wanted);
    // What a client sends for "nothing" asks for nothing.
    let nothing = json!({"prompt": "hi", "max_tokens": 2, "presence_penalty": 0,
        "frequency_penalty": null, "repetition_penalty": 1, "logit_bias": {}});
    let (status, body) = server.post("/v1/completions", nothing);
    assert_eq!(status, 200, "{body}");
    assert!(server.asked()[1].opts.penalties.is_none());
}

#[test]
fn out_of_range_penalties_and_foreign_tokens_are_refused_by_name() {
    let server = TestServer::start();
    let vocab = server.tokenizer.vocab_size();
    for (field, value) in [
        ("presence_penalty", json!(2.5)),
        ("frequency_penalty", json!(-3)),
        ("repetition_penalty", json!(0)),
        ("repetition_penalty", json!(1e-30)),
        ("repetition_penalty", json!(11)),
        ("logit_bias", json!({"50": 101})),
        ("logit_bias", json!({"50": "high"})),
        ("logit_bias", json!({"fifty": 1})),
        ("logit_bias", json!({"50": 1, "050": 2})),
        ("logit_bias", json!({vocab.to_string(): 1})),
        ("logit_bias", json!([50, 1])),
    ] {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let mut body = json!({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]});
            let other = if path == "/v1/completions" {
                "messages"
            } else {
                "prompt"
            };
            body.as_object_mut().unwrap().remove(other);
            body[field] = value.clone();
            let (status, answer) = server.post(path, body);
            assert_eq!(status, 400, "{path} {field} {value}: {answer}");
            let error = &answer["error"];
            assert!(
                error["message"].as_str().unwrap().contains(field),
                "{answer}"
            );
            assert_eq!(error["param"], field, "{answer}");
        }
    }
    let too_many: serde_json::Map<_, _> = (0..=1024).map(|t| (t.to_string(), json!(1))).collect();
    let (status, answer) = server.post(
        "/v1/completions",
        json!({"prompt": "hi", "logit_bias": too_many}),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        server.asked().is_empty(),
        "a refused request reached the model"
    );
}
