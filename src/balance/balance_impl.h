/*
 * balance_impl.h — inside the balance module: what profile.c shares with
 * profile_json.c.
 */
#ifndef GP_BALANCE_IMPL_H
#define GP_BALANCE_IMPL_H

#include "balance/balance.h"

/* gp_profile_model_hash of the model a profile says it was taken of,
 * computed from its stored input and per-layer spec texts (profile.c), so
 * that a loaded profile whose texts do not match its hash is caught. */
uint64_t gp_profile_stored_hash(const gp_profile *p);

#endif /* GP_BALANCE_IMPL_H */
