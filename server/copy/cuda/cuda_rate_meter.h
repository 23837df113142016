// The cuda backend's CopyRateMeter (timing/copy_rate_meter.h): the copy rate of each GPU of a group
// alone and of the group's GPUs together (one link's GPUs: the aggregate is the link's
// capacity), per direction, timed on the devices, within a time budget. What to measure and what to do with the figures
// is link calibration's (session/link_calibration.h, the one place that decides which links
// are measured and how they are paced); this file only measures, on the devices.
//
// One measurement (a "window") on one GPU runs on its device thread (CudaCopyEngine::RunOnDevice):
// copies of `copy_bytes` between a device buffer (cudaMalloc) and a page-aligned, touched,
// pinned (cudaHostRegister) host buffer, back to back on a stream of its own, each followed by a
// timing event. The stream is kept `queue_seconds` of copy work deep (at the rate seen so far;
// 4 to 512 copies), so the copy engine does not idle while the host thread is descheduled (a
// shared host deschedules for milliseconds). The first copies, while the queue is still
// shallow, only estimate the rate that sizes it; the count starts at the completion of the
// first copy issued after that (the base). Every later copy that completes by the window's end (or, if fewer
// than three did, its end plus its length again: a host thread that woke late) gives bytes
// copied since the base over the device time since it (cudaEventElapsedTime, the GPU's clock, so
// a host thread that wakes late does not skew it), and the last such figure is the GPU's rate.
// Copies queued at the window's end drain uncounted. GPUs measured
// together start at one instant and all keep copying past the window's end, so each counted copy
// ran while all of them did and the sum of their rates is what the group moves at once.
//
// A group's sequence: buffers on every GPU; each GPU alone, D2H then H2D; for two or more GPUs,
// all together, D2H then H2D; buffers freed. Every GPU of the group is held by the measurement
// (its device thread runs it) from the first window to the last, so traffic on the group's other
// GPUs cannot share the link with a GPU measured alone; chunks posted to those GPUs meanwhile
// wait on their device threads. Groups run one after another; before the first, every GPU's
// device thread (and the daemon's context on it) is started, in parallel.
//
// Budget: everything, context creation included, ends within about `budget_seconds`, plus one
// queue's drain. Each window is max_window_seconds, or less when the time left divided among the
// windows left (all groups) is less; a window that would be shorter than min_window_seconds is
// not run, and its group reports DEADLINE_EXCEEDED with the figures measured before it.
//
// Sources: the 55 GB/s per direction that a PCIe 5 x16 H200 reaches is nvbandwidth's figure
// (docs/ARCHITECTURE.md, "Links"); measuring each GPU alone and then all at once, as here, is
// what nvbandwidth's host_to_device_memcpy_ce and its all-to-host variants do.
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_RATE_METER_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_RATE_METER_H_

#include <memory>

#include "server/copy/timing/copy_rate_meter.h"

namespace offloadd::copy {

class CudaCopyEngine;

// The meter over a cuda engine's device threads (`engine` is not owned and must outlive it).
std::unique_ptr<CopyRateMeter> NewCudaCopyRateMeter(CudaCopyEngine* engine);

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_RATE_METER_H_
