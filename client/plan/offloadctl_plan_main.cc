// Stand-alone `offloadctl plan` for manual use: offloadctl_plan --hf-config FILE --seq 4K ...
#include "client/plan/plan_command.h"

int main(int argc, char** argv) { return offloadd::plan::RunPlanCommand(argc, argv); }
