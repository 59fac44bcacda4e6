// The 4-dimensional toy model of 000_*.txt ("What Actually Lives in the KV Cache"), as the reference runs it.
//
// The document prints: the embeddings of "the cat sat on" (ids 10 12 13 16), the columns of W_K and W_V (as the
// second factors of its worked dot products for "the"), the Q of "the" and "on", and, in turn 2, the Q and the K
// row of the generated token "mat" (id 14). It leaves out W_Q, mat's embedding, layer 1, the MLP and the
// unembedding. What is missing is derived here, and marked so in golden/000_*.json:
// - mat's embedding: the unique e with e · W_K = K_mat (det W_K = 5, so unique; it is integer);
// - W_Q: e · W_Q = Q for the, on and mat is 12 equations in 16 unknowns, so not unique. We take the one matrix
//   whose every entry lies in {1, 2, 3}, the range of every W_K and W_V entry printed (unique within that range);
// - layer 1: zeros. Nothing the document prints depends on it (all printed numbers are layer 0).
// - vocabulary rows other than the five printed ids: zeros.
#pragma once

#include "kvcheck/reference/model.hpp"

#include <vector>

namespace kvc::golden {

using LD = long double;

// Transcribed from 000_*.txt; each vector as printed.
struct Toy4dPrinted {
    std::vector<int> prompt;              // the cat sat on: 10 12 13 16
    int mat_id = 14;                      // turn 1's next token, printed
    ref::Mat<LD> embeddings;              // [4 x 4] rows: the, cat, sat, on
    ref::Mat<LD> w_k_columns, w_v_columns; // [4 x 4] row j = column j (K_j = e · column_j)
    ref::RowVec<LD> q_the, q_on, q_mat;   // [4]
    ref::RowVec<LD> k_mat;                // [4] turn 2's K row for mat
};
const Toy4dPrinted& toy4d_printed();

struct Toy4d {
    ref::ModelConfig cfg;           // d_model 4, 2 layers, 1 head, head_dim 4, scale 1/sqrt(4), nothing else
    ref::Weights<LD> weights;       // vocab 17
    ref::RowVec<LD> mat_embedding;  // [4] derived, unique
    ref::Mat<LD> w_q;               // [4 x 4] derived, not unique
    ref::RowVec<LD> w_q_null;       // [4] every column of W_Q is free along this direction (integers, first > 0)
    LD w_k_det = 0;                 // 5: why mat's embedding is unique
    int q_system_rank = 0;          // 3: rank of [e_the; e_on; e_mat], why W_Q is not
    // "." (turn 2's next token) is printed without an id. Only the row count after turn 2 needs it appended, and
    // the count does not depend on which row, so we append this id (a zero embedding row).
    int dot_placeholder_id = 0;
};
// Built once; throws std::logic_error if a derivation above fails.
const Toy4d& toy4d();

} // namespace kvc::golden
