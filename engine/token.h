/*
 * engine/token.h — the one token-id type.
 *
 * A token id indexes the model's vocabulary: the tokenizer's byte-pair ranks first, then its
 * special tokens (kl_tok_n_vocab), and the rows of the embedding and of lm_head.  Every id
 * that crosses an engine API (tokenizer, chat stop ids, sampler, forward pass, generation,
 * session) is a kl_token; unsigned, so "negative id" is not a state to check for.
 */
#ifndef KL_ENGINE_TOKEN_H
#define KL_ENGINE_TOKEN_H

#include <stdint.h>

typedef uint32_t kl_token;

#define KL_TOKEN_MAX UINT32_MAX

#endif
