// The sizes and limits a module's callers need to size its launches (threads per block, shared
// memory layouts, capacities, argument struct sizes), as one table per module that the host reads
// from the loaded image (graphkern._cuda.runtime.exports): Python never restates a device constant,
// so a change here cannot leave the caller silently wrong.
//
//     GRAPHKERN_EXPORTS = {{"threads", kThreads}, {"term_bytes_f32", sizeof(Term<float>)}};
#pragma once

namespace gk {

struct ExportRow {
    char name[40];
    long long value;
};
static_assert(sizeof(ExportRow) == 48, "graphkern._cuda.runtime reads 48-byte rows");

}  // namespace gk

#define GRAPHKERN_EXPORTS extern "C" __constant__ const gk::ExportRow graphkern_exports[]
