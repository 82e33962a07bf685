//! `GET /v1/models`: the one served model.

use axum::extract::State;
use axum::Json;

use super::AppState;
use crate::engine::ServingEngine;
use crate::openai::responses::{ModelCard, ModelList};

pub async fn handle<E: ServingEngine>(State(state): State<AppState<E>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.served_model_name.to_string(),
            object: "model",
            created: state.started_unix,
            owned_by: "specula",
            root: state.model_root.to_string(),
            parent: None,
            max_model_len: state.limits().max_model_len,
        }],
    })
}
