// A stand-in for a mori checkout's logging header: logs nothing, needs no logging library.
#pragma once
#define FAKE_MORI_LOG(text) ((void)(text))
