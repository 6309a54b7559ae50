// The sizes and limits a module's callers need to size its launches (threads per block, shared
// memory layouts, capacities, argument struct layouts), as one table per module that the host
// reads from the loaded image (graphkern._cuda.runtime.exports): Python never restates a device
// constant, so a change here cannot leave the caller silently wrong.
//
//     GRAPHKERN_EXPORTS = {{"threads", kThreads}, GK_STRUCT("job_f32", PairJob<float>, JOB_FIELDS)};
//
// where JOB_FIELDS(X, N, S) is X(N, S, first_field) X(N, S, second_field) ...; every row, a
// GK_STRUCT's included, ends with its comma.
#pragma once

#include <cstddef>
#include <type_traits>

namespace gk {

struct ExportRow {
    char name[40];
    long long value;
};
static_assert(sizeof(ExportRow) == 48, "graphkern._cuda.runtime reads 48-byte rows");

// A struct argument's field as one row "<struct>.<field>": offset | size << 32 | kind << 48, the
// kind the C type the host must write (graphkern._cuda.runtime.Layout).
enum FieldKind : long long { kPointer = 0, kSigned = 1, kUnsigned = 2, kFloat = 3, kOther = 4 };

template <typename F>
constexpr long long field_kind() {
    return std::is_floating_point<F>::value ? kFloat
           : std::is_integral<F>::value     ? (std::is_signed<F>::value ? kSigned : kUnsigned)
           : !std::is_class<F>::value && !std::is_array<F>::value && sizeof(F) == sizeof(void*) ? kPointer
                                                                                                 : kOther;
}

constexpr long long field_row(std::size_t offset, std::size_t size, long long kind) {
    return (long long)offset | (long long)size << 32 | kind << 48;
}

}  // namespace gk

#define GRAPHKERN_EXPORTS extern "C" __constant__ const gk::ExportRow graphkern_exports[]

// The rows of struct S exported as NAME: "NAME" its size, then "NAME.<field>" for every field that
// FIELDS (a macro taking a macro of (NAME, S, field)) names.
#define GK_STRUCT(NAME, S, FIELDS) {NAME, (long long)sizeof(S)}, FIELDS(GK_FIELD_ROW, NAME, S)
#define GK_FIELD_ROW(NAME, S, F) \
    {NAME "." #F, gk::field_row(offsetof(S, F), sizeof(S::F), gk::field_kind<decltype(S::F)>())},
