#pragma once
// FERRY_API marks what libferry.so exports; everything else is hidden (-fvisibility=hidden).
#define FERRY_API __attribute__((visibility("default")))
